#!/usr/bin/env bash
# The device half of one GPU session (README.md beside this file), in <= 7 minutes on an H100: the wheels
# and imports checked before anything is built (a missing wheel costs seconds, not minutes), the device's
# versions first, then `gpu-check --speed` (decode SDPA and flex, one soft and one hard RL step with the
# update profiled, the fused-head A/B at the paper's head size), stopped by SIGINT at 330 s so that its
# clean-up runs and its report, written as it measures, says where it stopped. Everything lands under $OUT.
set -uo pipefail
OUT=${OUT:?the device tool sets OUT}
mkdir -p "$OUT/gc"
shopt -s nullglob
wheels=(.whl/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "session: no wheels in .whl/ (run benchmarks/device/wheels.sh on the development machine and carry .whl)" >&2
  exit 2
fi
timeout 60 python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}" \
  || { echo "session: installing the carried wheels failed" >&2; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/src
timeout 90 python3 -c "import jsonschema, yaml, torch, transformers, softtokens.gpucheck.run, softtokens.cli" \
  || { echo "session: an import the run needs fails (see above): nothing was built" >&2; exit 4; }
# the device's stack before any number: torch, CUDA, transformers, driver, and how they differ from the pins
python3 -c "
import json, sys
from softtokens.gpucheck.run import version_warnings, versions
v = versions(); json.dump({**v, 'warnings': version_warnings(v)}, open(sys.argv[1], 'w'), indent=1)
print('device stack:', v); [print('WARNING:', w) for w in version_warnings(v)]" "$OUT/versions.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv" 2>&1
timeout -s INT -k 20 330 python3 -m softtokens gpu-check --speed --out "$OUT/gc" --work-dir /tmp/gc-work \
  > "$OUT/gc/log.txt" 2>&1
echo "gpu-check rc=$?" >> "$OUT/gc/log.txt"
rm -rf /tmp/gc-work
tail -n 8 "$OUT/gc/log.txt"
