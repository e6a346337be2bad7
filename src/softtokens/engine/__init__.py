"""The CoT decoding engine: one loop for hard, soft and fuzzy chains of thought (Section 3).

Each row runs a small state machine, all rows in lockstep, one forward per step:

    COT ──(shadow text ends with "The final answer is:")──► PREFILL " \\boxed{" ──► ANSWER ──► DONE
        └─(CoT limit reached)──► PREFILL "The final answer is: \\boxed{" ─┘

At a CoT step the next input is, with p = softmax(logits / tau) (tau = 0: argmax):
- hard: the embedding E[x] of x ~ p (the greedy shadow token is x itself);
- soft / fuzzy: h~ = p @ E + sigma * N(0, I), shadow token argmax(logits).
Soft and fuzzy differ only in tau (0.5 vs 0.0001); they are one code path. Answer tokens are
always hard. Everything fed is recorded, so the training pass replays exactly the inputs the
rollout consumed and never re-samples noise.

Modules: ``settings`` (modes, the six inference settings, noise placements), ``cot`` (the fast
engine) and ``reference`` (the plain loop it must reproduce), both on ``base``; ``decode_run``
(one decoding call's device state) built from ``step_inputs`` (what each row is fed),
``row_states`` (the state machine) and ``step_record`` (what was fed); ``kvcache``,
``decode_forward``, ``stoprule``, ``noise``, ``sampling``; ``rollout`` (the record's types).
See docs/engine.md.
"""
