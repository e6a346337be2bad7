"""The CoT stop rule (Appendix C), as text and as a finite automaton over token ids.

The paper stops when the text 'ends with "The final answer is: "'. BPE tokenizers attach a
space to the following word (" \\boxed"), so that text is rarely ever the end of a generated
prefix; we stop when the CoT's shadow text, trailing whitespace removed, ends with "The final
answer is:", which fires on the paper's condition and one token earlier when the model writes
"is:" without a lone space token. The prefill " \\boxed{" then yields exactly "The final
answer is: \\boxed{". ``ends_with_stop`` is that rule on text (the reference loop's test).

The automaton lets the fast engine test it on the device, every row at once, with no decoded
text and no host round-trip. Text T satisfies the rule iff T matches ``.*STOP\\s*``. A state
that decides it after each token is (k, f): k = the length of the longest prefix of STOP that
is a suffix of T (the Knuth-Morris-Pratt state), f = whether ``T.rstrip()`` ends with STOP.
Appending a character c: k follows the KMP automaton; f is unchanged if c is whitespace
(``str.isspace``, the same test as ``str.rstrip``), else f = (k == len(STOP)). Composing the
per-character steps over each token's text gives one transition table (V tokens x states), so a
decode step is one gather: ``state = table[token, state]``; ``accepting[state]`` is f.
"""

from __future__ import annotations

import numpy as np
import torch

from softtokens.data.prompt import STOP_TEXT


def ends_with_stop(text: str) -> bool:
    """The CoT stopping test on text, trailing whitespace ignored (the module docstring)."""
    return text.rstrip().endswith(STOP_TEXT)


def _kmp_failure(pattern: str) -> list[int]:
    fail = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        fail[i] = k
    return fail


class StopAutomaton:
    """Transition table over token pieces for 'text.rstrip().endswith(stop)'.

    States are numbered k + (len(stop) + 1) * f; state 0 is the empty text."""

    def __init__(self, stop: str, pieces: list[str]):
        if not stop or stop[-1].isspace():
            raise ValueError("the stop text must be non-empty and end with a non-whitespace character")
        self.stop = stop
        m = len(stop)
        self.n_states = 2 * (m + 1)
        fail = _kmp_failure(stop)

        def kmp(k: int, c: str) -> int:
            if k == m:
                k = fail[m - 1]
            while k and stop[k] != c:
                k = fail[k - 1]
            return k + 1 if stop[k] == c else 0

        states = np.arange(self.n_states)
        k_of, f_of = states % (m + 1), states // (m + 1)
        by_class: dict[object, np.ndarray] = {}

        def char_step(c: str) -> np.ndarray:
            # characters outside the stop text act alike, up to whitespace-ness
            key = c if c in stop else c.isspace()
            if key not in by_class:
                k_new = np.array([kmp(int(k), c) for k in k_of])
                f_new = f_of if c.isspace() else (k_new == m).astype(np.int64)
                by_class[key] = k_new + (m + 1) * f_new
            return by_class[key]

        table = np.empty((len(pieces), self.n_states), dtype=np.int64)
        for v, piece in enumerate(pieces):
            s = states
            for c in piece:
                s = char_step(c)[s]
            table[v] = s
        self.table = torch.from_numpy(table)
        self.accepting = torch.from_numpy(f_of.astype(bool))

    def run(self, token_ids: list[int], state: int = 0) -> int:
        """The state after feeding token_ids (host-side; for tests and checks)."""
        for t in token_ids:
            state = int(self.table[t, state])
        return state

    def accepts(self, state: int) -> bool:
        return bool(self.accepting[state])
