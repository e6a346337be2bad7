"""The multiverse of the paper grid's claims (robustness.multiverse) on the paper's own numbers, timed against the
baseline it adds to in the same process: the claims judged once at the default specification with the
one-at-a-time alternatives. Per claim: the specifications, how many were enumerated (the choices that act on it),
how many are distinct, and the seconds.

    python benchmarks/multiverse_time.py --out benchmarks/results/multiverse_HOST.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from softtokens.cells.paper import load_paper_results
from softtokens.store.provenance import device
from softtokens.robustness import multiverse
from softtokens.verdict.choices import DEFAULT
from softtokens.verdict.claims import judge_paper_claims, paper_index, plans_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    paper = load_paper_results()
    start = time.perf_counter()
    judge_paper_claims(paper, sensitivity=False)
    baseline = time.perf_counter() - start
    index_for = paper_index(paper)
    per_claim, total = [], 0.0
    for defn, plan in plans_for(index_for(DEFAULT), None):
        if not plan:
            continue
        t0 = time.perf_counter()
        m = multiverse.claim_multiverse(defn, plan, index_for, "paper", DEFAULT)
        seconds = time.perf_counter() - t0
        total += seconds
        per_claim.append({"claim": defn.key, "specifications": m["specifications"], "enumerated": m["enumerated"],
                          "distinct": m["distinct"], "counts": m["counts"], "seconds": round(seconds, 2)})
        print(f"{defn.key}: {m['distinct']:,} distinct of {m['enumerated']:,} enumerated "
              f"({m['specifications']:,} combinations) in {seconds:.1f} s", flush=True)
    out = {"host": platform.node(), "device": device(), "cpus": os.cpu_count(),
           "baseline_default_judgement_s": round(baseline, 2), "multiverse_s": round(total, 2),
           "ratio_to_baseline": round(total / baseline, 1), "claims": per_claim}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"the multiverse of the paper grid: {total:.1f} s ({total / baseline:.1f}x the default judgement's "
          f"{baseline:.2f} s)")


if __name__ == "__main__":
    main()
