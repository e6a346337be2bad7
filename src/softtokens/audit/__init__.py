"""The audit: one table cell walked back to its evaluation files and every provenance link above them
(``cell``), and the state of a whole grid while it runs (``status``).

Why a room of its own: "where did each number come from" is one of the three things a user comes for."""
