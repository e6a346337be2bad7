#!/usr/bin/env bash
# The device half of one GPU session (README.md beside this file): install the carried wheels, run
# gpu-check for soft and hard (engine with the attention A/B, evaluation, training with the update
# profile), then the fused head against the checkpointed one in bf16. Everything lands under $OUT.
set -uo pipefail
OUT=${OUT:?the device tool sets OUT}
mkdir -p "$OUT/gc" "$OUT/bench"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv" 2>&1
timeout 430 python3 -m softtokens gpu-check --out "$OUT/gc" --modes soft,hard > "$OUT/gc/log.txt" 2>&1
echo "gpu-check rc=$?" >> "$OUT/gc/log.txt"
timeout 90 python3 benchmarks/head_loss_speed.py --vocab 128256 --hidden 3072 --rows 16 --steps 544 --repeats 3 \
  > "$OUT/bench/head_loss_speed.json" 2> "$OUT/bench/head_loss_speed.log"
echo "head_loss_speed rc=$?" >> "$OUT/bench/head_loss_speed.log"
tail -n 5 "$OUT/gc/log.txt" "$OUT/bench/head_loss_speed.log"
