"""The llama.cpp lane (`pytest -m llama_cpp`; not in the default run: the first build of llama.cpp takes ~25 min on a
2-core machine, later runs find it cached): scripts/build_llama_cpp.sh builds llama-quantize and llama-server, a
trained tiny LFM2 is exported to q4_k_m through llama-quantize, served by llama-server, and `eval --server` scores
the generation benchmark through llama.cpp's own kernels - the same score as transformers' GGUF path within
tolerance. LEAP_LLAMA_CPP_DIR chooses the build folder (default: the script's cache folder)."""

from __future__ import annotations

import contextlib
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
    env = {**os.environ, "LLAMA_CPP_TARGETS": "llama-quantize llama-server llama-bench"}
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


@contextlib.contextmanager
def _served(llama_cpp: Path, gguf: Path, log: Path):
    """llama-server on the file (the file's own chat template, --jinja) once it answers /health; its port."""
    port = _free_port()
    with log.open("w") as handle:  # (a file: a pipe nobody reads could fill and stall the server)
        server = subprocess.Popen(
            [str(llama_cpp / "build" / "bin" / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1",
             "--port", str(port), "-c", "512", "--jinja", "-np", "2"],
            stdout=subprocess.DEVNULL,
            stderr=handle,
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
            yield port
        finally:
            server.terminate()
            server.wait(timeout=30)


def test_q4_k_m_through_llama_server_scores_as_the_transformers_gguf_path(llama_cpp, run):
    out = run["folder"] / "gguf"
    result = invoke("export", str(run["run"]), "--gguf", "q8_0,q4_k_m", "--llama-cpp", str(llama_cpp), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "quantizing to q4_k_m (llama-quantize" in result.stderr
    record = json.loads((out / "quantization.json").read_text())
    bench = {b["name"]: b for b in record["verification"]["benchmarks"]}["capitals"]  # (generation)
    transformers_score = bench["gguf"]["q4_k_m"]["score"]
    assert bench["original"] >= 0.75
    with _served(llama_cpp, out / "quickstart-q4_k_m.gguf", run["folder"] / "llama-server.log") as port:
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


def test_k_quant_blocks_of_a_model_with_256_wide_rows_read_back_as_llama_cpp_wrote_them(llama_cpp, tmp_path):
    """The tiny models' rows (128 values) are shorter than a k-quant block (256): llama-quantize stores them as q5_0
    / q8_0. A model 256 wide gets real Q4_K / Q6_K blocks: transformers' reading of them (what `eval` and the
    verification score) equals the gguf package's reference dequantiser, and is the trained weight within 4-bit
    rounding."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from leap_finetune.models.gguf import load_gguf
    from leap_finetune.models.tiny import TINY_ARCH, load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    torch.manual_seed(0)
    config = Lfm2Config(
        **{**TINY_ARCH, "hidden_size": 256, "intermediate_size": 768},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Lfm2ForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "wide")
    tokenizer.save_pretrained(tmp_path / "wide")
    out = tmp_path / "gguf"
    result = invoke("export", str(tmp_path / "wide"), "--gguf", "q4_k_m", "--llama-cpp", str(llama_cpp), "-o", str(out))
    assert result.returncode == 0, result.stderr
    reader = GGUFReader(str(out / "wide-q4_k_m.gguf"))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.ffn_gate.weight"] == "Q4_K" and "Q6_K" in kinds.values()
    loaded, _ = load_gguf(out / "wide-q4_k_m.gguf")
    ours = loaded.state_dict()["model.layers.0.feed_forward.w1.weight"]
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    reference = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type))).reshape(ours.shape)
    assert torch.equal(ours, reference.float())
    trained = model.state_dict()["model.layers.0.feed_forward.w1.weight"]
    assert (ours - trained).norm() / trained.norm() < 0.1  # 4-bit blocks: a few percent of the weight


def test_an_lfm2_moe_export_is_served_by_llama_cpp_and_scores_what_it_learned(llama_cpp, tmp_path):
    """tiny-lfm2-moe trained on the quickstart, exported to q8_0 through llama.cpp's converter (its lfm2moe
    architecture), served by llama-server: `eval --server` scores the generation benchmark near the trained model's
    own score (transformers cannot read an LFM2-MoE GGUF back: llama.cpp is where it is scored)."""
    import shutil

    shutil.copy(ROOT / "examples" / "quickstart.yaml", tmp_path / "quickstart.yaml")
    shutil.copytree(ROOT / "examples" / "data", tmp_path / "data")
    config = tmp_path / "quickstart.yaml"
    config.write_text(config.read_text().replace("model_name: tiny-lfm2\n", "model_name: tiny-lfm2-moe\n"))
    trained = invoke(str(config), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    [run_folder] = list((tmp_path / "outputs" / "quickstart").iterdir())
    out = tmp_path / "gguf"
    result = invoke("export", str(run_folder), "--gguf", "q8_0", "--llama-cpp", str(llama_cpp), "-o", str(out))
    assert result.returncode == 0, result.stderr
    from leap_finetune.models.gguf import header

    assert header(out / "quickstart-q8_0.gguf")["general.architecture"] == "lfm2moe"
    record = json.loads((out / "quantization.json").read_text())
    original = {b["name"]: b for b in record["verification"]["benchmarks"]}["capitals"]["original"]
    with _served(llama_cpp, out / "quickstart-q8_0.gguf", tmp_path / "llama-server.log") as port:
        results = tmp_path / "server.json"
        evaluated = invoke("eval", str(config), "--server", f"http://127.0.0.1:{port}/v1", "--output", str(results))
        assert evaluated.returncode == 0, evaluated.stderr
        score = json.loads(results.read_text())["results"]["benchmark/capitals/score"]
        assert original >= 0.75 and abs(score - original) <= SERVER_TOLERANCE


def test_gguf_auto_keeps_the_smallest_quant_within_the_bounds(llama_cpp, run):
    """The whole ladder exported and scored: a loose bound keeps the smallest file (q4_0) and only it; a bound of 0
    passes no quant (every one moves the predictions a little): exit 2, nothing kept, the table printed."""
    loose = run["folder"] / "auto-loose"
    result = invoke("export", str(run["run"]), "--gguf", "auto", "--max-drop", "0.5", "--max-kl", "1",
                    "--llama-cpp", str(llama_cpp), "-o", str(loose))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [p.name for p in loose.glob("*.gguf")] == ["quickstart-q4_0.gguf"]
    record = json.loads((loose / "quantization.json").read_text())["auto"]
    assert record["chosen"] == "q4_0" and [r["type"] for r in record["ladder"]] == ["q8_0", "q6_k", "q5_k_m",
                                                                                   "q4_k_m", "q4_0"]  # fmt: skip
    assert "## Which quant (--gguf auto)" in (loose / "README.md").read_text()
    strict = run["folder"] / "auto-strict"
    result = invoke("export", str(run["run"]), "--gguf", "auto", "--max-drop", "0", "--max-kl", "0",
                    "--llama-cpp", str(llama_cpp), "-o", str(strict))  # fmt: skip
    assert result.returncode == 2 and "no quant of the ladder" in result.stderr
    assert not strict.exists() or not any(strict.iterdir())


def test_each_exported_file_is_timed_on_this_cpu_by_llama_bench(llama_cpp, run):
    """export finds llama-bench beside llama-quantize: prompt and generation tokens/s of each file, in the table,
    quantization.json, the card and speed.png (score against speed); --no-speed skips it and says so."""
    out = run["folder"] / "speed"
    result = invoke("export", str(run["run"]), "--gguf", "q8_0,q4_0", "--llama-cpp", str(llama_cpp), "-o", str(out))
    assert result.returncode == 0, result.stderr
    device = json.loads((out / "quantization.json").read_text())["device"]
    assert set(device["files"]) == {"q8_0", "q4_0"} and device["cpu"]
    for figures in device["files"].values():
        assert figures["prompt_tokens_per_s"] > 0 and figures["generation_tokens_per_s"] > 0
    assert "## Speed on a CPU" in (out / "README.md").read_text() and (out / "speed.png").stat().st_size > 0
    skipped = run["folder"] / "no-speed"
    result = invoke("export", str(run["run"]), "--gguf", "q8_0", "--no-speed", "-o", str(skipped))
    assert result.returncode == 0 and "device speed: not measured (--no-speed was given)" in result.stderr


def test_llama_server_renders_the_benchmark_prompts_as_training_did_and_a_difference_is_shown(llama_cpp, run):
    """gguf_export/parity.py against the real llama-server: the quickstart's prompts are byte for byte the same;
    a rendering that differs (a changed system prompt, as a runtime's own default would add) is found, with the
    character where it starts and the text on each side."""
    from leap_finetune.gguf_export import parity

    out = run["folder"] / "parity"
    result = invoke("export", str(run["run"]), "--gguf", "q8_0", "--no-speed", "--llama-cpp", str(llama_cpp),
                    "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "quantization.json").read_text())["serving_parity"]
    assert record["rows"] == 24 and record["same"] == 24 and record["differ"] == []
    assert "renders all 24 benchmark prompts" in (out / "README.md").read_text()

    class Changed:
        def prompt_text(self, messages, tools=None):
            return "<|startoftext|><|im_start|>system\nBe brief.<|im_end|>\n"  # (not what the server renders)

    items = [("capitals", [{"role": "user", "content": "What is the capital of France?"}], None)]
    found = parity.check(llama_cpp / "build" / "bin" / "llama-server", out / "quickstart-q8_0.gguf", items, Changed())
    assert found["same"] == 0 and found["differ"][0]["at"] == len("<|startoftext|><|im_start|>")
    assert found["differ"][0]["ours"].endswith("<|im_start|>system\nBe brief.<|im_end")  # (24 characters each side)
    assert "user" in found["differ"][0]["server"]


def test_a_lora_run_ships_as_its_base_and_an_adapter_that_llama_server_runs(llama_cpp, tmp_path):
    """--gguf-adapter: the base in q8_0 and the adapter as its own f16 GGUF file (llama.cpp's LoRA converter);
    llama-server running the base with the adapter answers the generation benchmark as the merged model does."""
    import shutil

    shutil.copy(ROOT / "examples" / "quickstart.yaml", tmp_path / "quickstart.yaml")
    shutil.copytree(ROOT / "examples" / "data", tmp_path / "data")
    config = tmp_path / "quickstart.yaml"
    config.write_text(config.read_text() + "\npeft_config:\n  extends: DEFAULT_LORA\n")
    trained = invoke(str(config), "--set", "training_config.num_train_epochs=10", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    [run_folder] = list((tmp_path / "outputs" / "quickstart").iterdir())
    out = tmp_path / "gguf"
    result = invoke("export", str(run_folder), "--gguf", "q8_0", "--gguf-adapter", "--no-speed",
                    "--llama-cpp", str(llama_cpp), "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.gguf")) == ["quickstart-lora-f16.gguf", "quickstart-q8_0.gguf"]
    from leap_finetune.models.gguf import header

    assert header(out / "quickstart-lora-f16.gguf")["general.type"] == "adapter"
    record = json.loads((out / "quantization.json").read_text())["adapter"]
    scores = record["verification"]["benchmarks"]["capitals"]
    assert abs(scores["merged"] - scores["base_and_adapter"]) <= SERVER_TOLERANCE
    assert "llama-server -m quickstart-q8_0.gguf --lora quickstart-lora-f16.gguf" in (out / "README.md").read_text()
