#!/usr/bin/env bash
# Wheels for what the GPU image lacks (it has torch and transformers), for its Python 3.12, into .whl/.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  jsonschema jsonschema-specifications referencing rpds-py attrs pyyaml
ls .whl
