"""A claim's specification curve (Simonsohn, Simmons and Nelson 2020), drawn from its multiverse record
(robustness.multiverse): per distinct specification, the comparison the verdict turns on, its estimate and
interval against the margin, sorted by estimate, coloured by the verdict; below, which choices each
specification changes from the default.

Why a picture: a share ("272 of 1,296 distinct specifications support it") says how many, not which; the
dashboard under the curve shows which choices the supporting ones share (no test-set term, say), so a
reader sees what a verdict rests on. Embedded in the HTML report as PNG bytes (no file of its own)."""

from __future__ import annotations

import io

import numpy as np

from softtokens.robustness.multiverse import shares_text

# the verdicts' colours, as the report's tables colour them (report.render.CSS)
CODE_COLOURS = {1: "#2e8b57", 0: "#e0a800", -1: "#c0392b", 2: "#999999"}
CODE_WORDS = {1: "supported", 0: "undecided", -1: "contradicted", 2: "not measured"}


def curve_rows(m: dict) -> list[dict]:
    """The curve's specifications that have a deciding comparison, sorted by its estimate (then its lower end)."""
    from softtokens.robustness.multiverse import curve_rows as rows_of

    rows = [r for r in rows_of(m) if r.get("decisive")]
    return sorted(rows, key=lambda r: (r["decisive"]["estimate"], r["decisive"]["lo"]))


def choice_rows(rows: list[dict]) -> list[str]:
    """The dashboard's rows: every choice label some specification takes away from the default, in first-seen order."""
    out: dict[str, None] = {}
    for r in rows:
        for label in r["choices"]:
            out.setdefault(label, None)
    return list(out)


def specification_curve_png(m: dict, title: str, unit: str) -> bytes | None:
    """The figure as PNG bytes (None: no specification has a deciding comparison)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = curve_rows(m)
    if not rows:
        return None
    labels = choice_rows(rows)
    x = np.arange(len(rows))
    est = np.array([r["decisive"]["estimate"] for r in rows])
    lo = np.array([r["decisive"]["lo"] for r in rows])
    hi = np.array([r["decisive"]["hi"] for r in rows])
    colours = [CODE_COLOURS[r["code"]] for r in rows]
    height = 2.6 + 0.18 * max(len(labels), 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, height), sharex=True,
                                      gridspec_kw={"height_ratios": [2.6, 0.18 * max(len(labels), 1) + 0.2]})
    top.vlines(x, lo, hi, colors=colours, linewidth=0.8 if len(rows) > 200 else 1.5, alpha=0.6)
    top.scatter(x, est, c=colours, s=4 if len(rows) > 200 else 12, zorder=3)
    top.axhline(0, color="#444", linewidth=0.8)
    rules = {r["decisive"]["rule"] for r in rows}
    margins = np.array([r["margin"] for r in rows])
    if rules & {"same", "not worse"} and np.any(margins > 0):
        top.step(x, -margins, where="mid", color="#555", linestyle="--", linewidth=0.8, label="-margin")
        if "same" in rules:
            top.step(x, margins, where="mid", color="#555", linestyle="--", linewidth=0.8, label="+margin")
    top.set_ylabel(unit)
    top.set_title(title, fontsize=10)
    for code in sorted({r["code"] for r in rows}):
        top.scatter([], [], c=CODE_COLOURS[code], s=12, label=CODE_WORDS[code])
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    for i, label in enumerate(labels):
        hit = [j for j, r in enumerate(rows) if label in r["choices"]]
        bottom.scatter(hit, [i] * len(hit), marker="|", s=20, color="#333", linewidths=0.6)
    bottom.set_yticks(range(len(labels)))
    bottom.set_yticklabels(labels or ["(the default only)"], fontsize=7)
    bottom.set_ylim(-0.7, max(len(labels), 1) - 0.3)
    bottom.invert_yaxis()
    bottom.set_xlabel(f"{len(rows):,} distinct specifications, sorted by the deciding comparison's estimate "
                      f"({m['specifications']:,} combinations)", fontsize=8)
    bottom.grid(False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def curve_blocks(c, numbers: str) -> list[tuple]:
    """The claim's specification curve (report.spec_curve), where its multiverse has one."""
    if not c.multiverse:
        return []
    unit = (c.margin or {}).get("unit") or ("nats per token" if "nll" in c.key else "percentage points")
    png = specification_curve_png(c.multiverse, f"{c.key} on {numbers}", unit)
    if png is None:
        return []
    return [("figure", (png, f"Specification curve of `{c.key}` on {numbers} ({shares_text(c.multiverse)}): per "
                             "distinct specification, the "
                             "comparison its verdict turns on (its estimate and the interval its tests read, the margin "
                             "dashed), sorted; below, the choices each one changes from the default"))]
