"""The claims as the report page and the docs show them: one row per claim (margin, verdict,
how many specifications support it, what would flip it), the answer the page opens with, the rules
in a paragraph, and the table of every choice a verdict rests on.

Why apart from the page: docs/protocol.md's generated table and the report page print the same rows
(tests hold them equal), and the page is long enough without them.
"""

from __future__ import annotations

import pandas as pd

from softtokens.robustness import multiverse
from softtokens.robustness.multiverse import margin_text, shares_text
from softtokens.verdict import judging
from softtokens.verdict.choices import CHOICES, PAPER_READING_NAME, Spec
from softtokens.verdict.specs import size
from softtokens.robustness.reproducibility import DRAWS


def words(c) -> str:
    if c.source == "ours":
        return "(our statement, not a sentence of the paper)"
    return " … ".join(f"“{q['text']}” ({q['where']})" for q in c.quotes)


def _margin(c) -> str:
    return "—" if not c.margin else f"±{c.margin['value']:g} {c.margin['unit']}"


BY_DESIGN = "— (undecided by design: it cannot be supported on these numbers)"


def could_be_otherwise(c) -> bool:
    """Whether the verdict could have gone another way on this design (verdict.design): an undecided
    verdict of a claim the numbers cannot support is the design's, not a finding."""
    return c.design is None or c.design.get("otherwise", True)


def robustness(c) -> str:
    """How many distinct specifications (every combination of the choices: robustness.multiverse) support the claim,
    and whether every one gives the default's verdict; shown only for a verdict that could have gone another way."""
    if not c.sensitivity and not c.multiverse:
        return "—"
    if not could_be_otherwise(c):
        return BY_DESIGN
    held, tried = c.support_one_at_a_time()
    text = f"{held:,} of {tried:,} distinct support one choice at a time ({len(c.sensitivity)} listed)"
    if c.multiverse:
        m = c.multiverse
        text += (f"; every combination: {m['counts'].get(judging.SUPPORTED, 0):,} of {m['distinct']:,} distinct "
                 f"({m['specifications']:,} combinations)")
    if c.verdict not in (judging.SUPPORTED, judging.CONTRADICTED):   # "robust" says a decision holds: none here
        return text
    return f"{text}; " + ("robust" if c.robust else "not robust")


def odds_text(c) -> str:
    """How likely the claim's verdict is to come out of a reproduction of the paper's grid, with the
    simulation's Monte-Carlo error (a plug-in probability: the paper's means taken as the truth)."""
    r = c.reproducibility
    if not r or r.get("p_supported") is None or not could_be_otherwise(c):
        return "—"
    p = {judging.SUPPORTED: r["p_supported"], judging.UNDECIDED: r["p_undecided"],
         judging.CONTRADICTED: r["p_contradicted"]}.get(c.verdict)
    if p is None:
        return "—"
    return f"{p:.2f} ± {1.96 * (p * (1 - p) / max(r.get('draws') or 1, 1)) ** 0.5:.2f}"


def design_text(c) -> str:
    """The verdict with what the design could decide, and the lean of an undecided one (first screen)."""
    if c.verdict in (judging.NOT_JUDGED, judging.NOT_MEASURED) or not c.design:
        return c.verdict
    d = c.design
    text = f"**{c.verdict}**"
    if not d["can_support"]:
        text += f"; cannot be supported on these numbers ({d['why_not']})"
    elif c.verdict == judging.UNDECIDED:
        text += "; could be decided on these numbers"
    if d.get("lean"):
        text += f"; {d['lean']}"
    if c.failed_runs:
        text += f"; rests on {len(c.failed_runs)} run(s) that failed to learn"
    return text


def glance_frame(theirs: list, ours: list, metric_ours: str | None = None) -> pd.DataFrame:
    """The first screen: per claim, its verdict on the paper's numbers and on ours, whether each could
    have gone another way on its design, and which way an undecided one leans."""
    rows = []
    for p, o in zip(theirs, ours):
        rows.append({"claim": f"`{p.key}`", "on the paper's numbers": design_text(p),
                     "on this grid's numbers" + (f" (pass@k read at {metric_ours})" if metric_ours else ""):
                         design_text(o)})
    return pd.DataFrame(rows)


def flips_text(c) -> str:
    """The smallest sets of choices that flip the verdict together (the multiverse), or that nothing does."""
    if c.multiverse:
        return multiverse.flips_text(c.multiverse)
    return "; ".join(c.flips()) or ("—" if not c.sensitivity else "nothing: every specification agrees")


def reading_text(c) -> str:
    """The verdict under the paper's own reading, where the claim has a multiverse."""
    return c.multiverse["paper_reading"] if c.multiverse else "—"


def claims_frame(theirs: list, ours: list | None = None) -> pd.DataFrame:
    """One row per claim: its margin, the verdict on the paper's numbers at the default specification,
    how many specifications support it, what would flip it; ours beside it (docs/protocol.md shows the
    paper's columns; a test holds the two equal)."""
    rows = []
    for i, p in enumerate(theirs):
        row = {"claim": f"`{p.key}`", "margin": _margin(p), "verdict (the paper's numbers)": p.verdict,
               f"{PAPER_READING_NAME} (± over seeds, normal)": reading_text(p),
               "specifications": robustness(p), "P(same verdict) in a reproduction": odds_text(p),
               "what would flip it": flips_text(p), "across margins": multiverse.margin_text(p.multiverse)}
        if ours is not None:
            o = ours[i]
            row = {"claim": p.statement, **{k: v for k, v in row.items() if k != "claim"},
                   "verdict (ours)": o.verdict + _metric_note(p, o)
                   + (f" (rests on {len(o.failed_runs)} run(s) that failed to learn)" if o.failed_runs else ""),
                   "specifications (ours)": robustness(o)}
        rows.append(row)
    return pd.DataFrame(rows)


def _metric_note(paper_claim, our_claim) -> str:
    """Where our grid's pass@k is not the paper's (the toy's pass@4 against pass@32), the metric our
    verdict was judged at."""
    import re

    theirs, ours = (set(re.findall(r"pass@\d+", c.statement)) for c in (paper_claim, our_claim))
    return f" (judged at {', '.join(sorted(ours))})" if ours and ours != theirs else ""


def _tally(claims_: list) -> str:
    judged = [c for c in claims_ if c.verdict not in (judging.NOT_JUDGED,)]
    counts = {v: sum(c.verdict == v for c in judged) for v in judging.VERDICTS}
    robust = [c.key for c in judged if c.robust and c.verdict == judging.SUPPORTED]
    words = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    return (f"{words} (of {len(judged)})" + (f"; supported under every combination of the choices: "
                                              f"{', '.join(f'`{k}`' for k in robust)}"
                                              if robust else "; none is supported under every combination of the choices"))


def answer(data: dict) -> str:
    """The page's first paragraph: how many claims hold on the paper's numbers and on ours, and how many
    of the undecided ones could not have been supported on those numbers at all."""
    text = (f"**The answer.** On the paper's own numbers: {_tally(data['claims_paper'])}. On this grid's numbers: "
            f"{_tally(data['claims_ours'])}.")
    forced = [c.key for c in data["claims_paper"] if not could_be_otherwise(c)]
    if forced:
        text += (f" {len(forced)} of the paper's undecided claims ({', '.join(f'`{k}`' for k in forced)}) cannot be "
                 "supported on its published numbers whatever they are (unpaired means: the test sets alone are "
                 "wider than the margin, or cells are missing): a reproduction with per-question results decides them "
                 "(`softtokens plan --claims KEY` prices one).")
    failed = sorted({r for c in data["claims_ours"] for r in c.failed_runs})
    if failed:
        text += (f" {len(failed)} of this grid's runs failed to learn (their best trained step validates below their base "
                 f"model, or answers no validation question: {', '.join(failed)}); the verdicts resting on them say so.")
    return text


def method(spec: Spec) -> str:
    """The rules in a paragraph, with the specification the verdicts are judged at."""
    n_paper, n_ours = size("paper"), size("ours")
    return (f"**How a claim is judged.** Each claim is the paper's sentence, quoted, and a rule read off its words. "
            f"A claim of sameness ('similar', 'comparable', 'matching', 'preserve', 'recover', 'no benefit') is "
            f"*supported* when the difference's {100 * (1 - 2 * spec.alpha):g}% confidence interval lies inside its "
            f"margin (two one-sided tests at {spec.alpha:g}), *contradicted* when it lies outside, *undecided* "
            f"otherwise; a claim of difference ('outperforms', 'degrades', 'lower') keeps its one-sided test. More noise "
            f"can only make a verdict undecided. Intervals use Student's t with Welch-Satterthwaite degrees of freedom "
            f"from the seeds. A quantifier over k comparisons ('most', 'generally', 'every') is judged family-wise "
            f"(partial conjunction), with the count the claim would give if it held exactly printed beside it. "
            f"Two of our cells are compared paired, question by question and seed by seed; the paper's means "
            f"cannot be. Every choice under a verdict is named below, with its reason, and each claim is judged again "
            f"under every combination of them (a multiverse: {n_paper:,} specifications on the paper's numbers, "
            f"{n_ours:,} on ours), each computation counted once (two specifications that compute the same numbers "
            f"for a claim are one distinct specification): a verdict is *robust* only where every one agrees, and "
            f"'what would flip it' names the fewest choices that do, together. A margin with no number in the paper "
            f"is a stated threshold, and the verdict is shown across a range of margins too. "
            f"'P(same verdict) in a reproduction': the share of "
            f"{DRAWS:,} simulated reproductions of the paper's grid (its numbers as the truth, its 3 seeds, judged "
            f"by these rules) that reach the verdict again (robustness.reproducibility; docs/protocol.md).")


def choices_frame() -> pd.DataFrame:
    """Every choice a verdict depends on: its default, why, and the alternatives tried (verdict.choices)."""
    rows = []
    for c in CHOICES:
        rows.append({"choice": c.name, "default": c.default_text(),
                     "alternatives tried": "; ".join(label for label, _ in c.alternatives) or "—",
                     "numbers it can change": ", ".join(c.sources), "why": c.why})
    return pd.DataFrame(rows)


def readings_frame(config: dict | None, grid: str) -> pd.DataFrame:
    """The settings that read what the paper does not say (config.grids.READINGS): this grid's value, why the default,
    and the alternative one setting away."""
    from softtokens.config.grids import PAPER_RL, resolved_rl
    from softtokens.config.readings import READINGS

    rl = resolved_rl(config, grid) if config and grid in config.get("grids", {}) else PAPER_RL
    return pd.DataFrame([{"setting": f"rl.{key}", "this grid": str(rl.get(key, PAPER_RL[key])), "why": why,
                          "the alternative": alternative} for key, (why, alternative) in READINGS.items()])


def multiverse_rows(c) -> list[str]:
    """A claim's multiverse in words (robustness.multiverse): its shares, what flips it, its margin curve, the paper's
    own reading."""
    m = c.multiverse
    if not m:
        return []
    rows = [f"every combination of the choices: {shares_text(m)} ({m['enumerated']:,} enumerated over the choices "
            f"that act on this claim: {', '.join(m['choices'])}; the others change nothing here: "
            f"{', '.join(m['not_acting']) or 'none'})",
            f"what would flip it: {multiverse.flips_text(m)}"]
    if m.get("margin_curve"):
        rows.append(f"across margins: {margin_text(m)}")
    rows.append(f"{PAPER_READING_NAME} (± over seeds alone, normal reference): {m['paper_reading']}")
    return rows


def one_at_a_time_rows(c) -> list[str]:
    return [f"one choice changed: {s_['specification']}: {s_['verdict']}"
            + (f" (the same computation as {s_['same_as']} on these numbers)" if s_.get("same_as") else "")
            for s_ in c.sensitivity[1:]]
