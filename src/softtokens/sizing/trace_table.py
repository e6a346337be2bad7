"""How a traced plan is read (gpucheck.trace_plan makes it): the band the plan is held to and the table it prints,
here below the tracer so that the docs and the report can show a committed trace without torch."""

from __future__ import annotations

BAND = (0.95, 1.05)       # traced / planned the plan is held to (issue 71)
HEADER = "| job | phase | planned GB | traced GB | traced / planned |"


def trace_table(records: list[dict]) -> str:
    """The Markdown table (HEADER), a row per (job, phase); a ratio outside BAND is marked."""
    lines = [HEADER, "|---|---|---|---|---|"]
    for r in records:
        ratio = f"{r['ratio']:.3f}"
        if not BAND[0] <= r["ratio"] <= BAND[1]:
            ratio = f"**{ratio}**"
        lines.append(f"| {r['job']} | {r['phase']} | {r['planned_gb']:.2f} | {r['traced_gb']:.2f} | {ratio} |")
    return "\n".join(lines)


def outside_band(records: list[dict]) -> list[dict]:
    return [r for r in records if not BAND[0] <= r["ratio"] <= BAND[1]]
