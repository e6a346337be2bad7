"""The verdict: the paper's claims (``claims/``, one module each, quoted against the LaTeX source:
``quotes``), how a claim is judged (``judging``: comparisons, rules, quantifiers), the errors under it
(``uncertainty``), every choice it rests on (``choices``) and the space of their combinations (``specs``), the
paper's cells with their spread and ours beside them (``reproduction``). How far a verdict holds (every combination
of the choices, simulated reproductions, the grid that settles a claim) is the room above: robustness/.

Why a room of its own: "did the paper reproduce" is one of the three things a user comes for; a new
contributor changing how a claim is judged finds every rule here, and nothing that prints a page."""
