"""The llama.cpp lane (`pytest -m llama_cpp`; not in the default run: the first build of llama.cpp takes ~25 min on a
2-core machine, later runs find it cached): scripts/build_llama_cpp.sh builds llama-quantize and llama-server, a
trained tiny LFM2 is exported to q4_k_m through llama-quantize, served by llama-server, and `eval --server` scores
the generation benchmark through llama.cpp's own kernels - the same score as transformers' GGUF path within
tolerance. LEAP_LLAMA_CPP_DIR chooses the build folder (default: the script's cache folder)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import invoke

pytestmark = pytest.mark.llama_cpp
ROOT = Path(__file__).resolve().parents[2]
# llama.cpp's q4_k_m kernels against transformers' float32 matmuls of the same dequantised weights: greedy answers
# of a tiny model may differ in a few rows.
SERVER_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def llama_cpp():
    env = {**os.environ, "LLAMA_CPP_TARGETS": "llama-quantize llama-server"}
    args = ["bash", str(ROOT / "scripts" / "build_llama_cpp.sh")]
    if os.environ.get("LEAP_LLAMA_CPP_DIR"):
        args.append(os.environ["LEAP_LLAMA_CPP_DIR"])
    built = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    folder = Path(built.stdout.strip().splitlines()[-1])
    assert (folder / "build" / "bin" / "llama-quantize").is_file()
    # a second call finds the programs and returns at once
    start = time.monotonic()
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == str(folder)
    assert time.monotonic() - start < 10
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The quickstart as a user runs it (a tiny LFM2 learns a fact lookup: both benchmarks 0 -> 1)."""
    import shutil

    folder = tmp_path_factory.mktemp("llama")
    shutil.copy(ROOT / "examples" / "quickstart.yaml", folder / "quickstart.yaml")
    shutil.copytree(ROOT / "examples" / "data", folder / "data")
    result = invoke(str(folder / "quickstart.yaml"), cwd=folder)
    assert result.returncode == 0, result.stderr
    [run_folder] = list((folder / "outputs" / "quickstart").iterdir())
    return {"folder": folder, "run": run_folder, "config": folder / "quickstart.yaml"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_q4_k_m_through_llama_server_scores_as_the_transformers_gguf_path(llama_cpp, run):
    out = run["folder"] / "gguf"
    result = invoke("export", str(run["run"]), "--gguf", "q8_0,q4_k_m", "--llama-cpp", str(llama_cpp), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "quantizing to q4_k_m (llama-quantize" in result.stderr
    record = json.loads((out / "quantization.json").read_text())
    bench = {b["name"]: b for b in record["verification"]["benchmarks"]}["capitals"]  # (generation)
    transformers_score = bench["gguf"]["q4_k_m"]["score"]
    assert bench["original"] >= 0.75
    port = _free_port()
    log = run["folder"] / "llama-server.log"
    server = subprocess.Popen(
        [str(llama_cpp / "build" / "bin" / "llama-server"), "-m", str(out / "quickstart-q4_k_m.gguf"), "--host", "127.0.0.1",
         "--port", str(port), "-c", "512", "--jinja", "-np", "2"],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),  # (a file: a pipe nobody reads could fill and stall the server)
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not start in 120 s"
            time.sleep(0.5)
        results = run["folder"] / "server.json"
        evaluated = invoke(
            "eval", str(run["config"]), "--server", f"http://127.0.0.1:{port}/v1", "--output", str(results)
        )
        assert evaluated.returncode == 0, evaluated.stderr
        server_score = json.loads(results.read_text())["results"]["benchmark/capitals/score"]
        print(f"q4_k_m: transformers (dequantised) {transformers_score:.3f}, llama-server {server_score:.3f}",
              file=sys.stderr)  # fmt: skip
        assert abs(server_score - transformers_score) <= SERVER_TOLERANCE
        assert server_score >= 0.5  # llama.cpp runs the trained model: it answers the task
    finally:
        server.terminate()
        server.wait(timeout=30)
