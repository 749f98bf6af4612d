#!/usr/bin/env bash
# Sets up .venv with leap-finetune and its tested dependencies. Idempotent.
#   bash scripts/setup.sh          # the package (CPU or GPU machine)
# torch is installed first and alone: on CPU-only machines a local CPU wheel (torch==2.13.0) is
# preferred, and a later requirement that let pip choose torch itself could start a multi-GB CUDA
# download. On a GPU machine, install the CUDA torch you want before running this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  $PIP install "torch==2.13.0"
fi
$PIP install -e ".[test]"
.venv/bin/python -c "import leap_finetune, torch, transformers, trl; print('leap-finetune', leap_finetune.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__)"
