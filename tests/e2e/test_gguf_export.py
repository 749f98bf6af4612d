"""`export --gguf`: a trained tiny LFM2 as GGUF files through llama.cpp's own converter, read back (architecture,
every tensor, chat template, special tokens), its logits against the transformers model's, each file verified on
the run's benchmarks (the reported quantization loss equals `eval` on the file), a LoRA run merged, LFM2-VL's
mmproj file, and the mistakes a user makes (each: exit 2, a message that says what to do, nothing written)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.cli_process import start_cli
from tests.conftest import fact_rows, invoke, tiny_config, train_full_and_lora, write_config, write_jsonl
from tests.watchdog import communicate

WORDS = ["red", "blue", "green", "gold", "pink", "gray", "teal", "navy"]
# q8_0 keeps 8 bits per weight in blocks of 32: on these benchmarks of the trained tiny model it scores within
# this many points (absolute, scores in [0, 1]) of the original (docs/export.md states the same tolerance).
Q8_TOLERANCE = 0.1


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A full fine-tune that learns `Say W twice.` -> `W W` with two benchmarks, and a LoRA run, through the CLI."""
    folder = tmp_path_factory.mktemp("gguf")
    write_jsonl(folder / "train.jsonl", fact_rows(48))
    write_jsonl(
        folder / "bench_generation.jsonl",
        [{"messages": [{"role": "user", "content": f"Say {w} twice."}, {"role": "assistant", "content": f"{w} {w}"}]}
         for w in WORDS],
    )  # fmt: skip
    write_jsonl(
        folder / "bench_mcq.jsonl",
        [{"messages": [{"role": "user", "content": f"Say {w} twice."}],
          "options": [f"{w} {w}", f"{WORDS[i - 1]} {WORDS[i - 1]}", w], "answer_id": 0}
         for i, w in enumerate(WORDS)],
    )  # fmt: skip
    evals = {
        "max_new_tokens": 6,
        "benchmarks": [
            {"name": "twice", "path": "bench_generation.jsonl", "metric": "exact_match"},
            {"name": "twice_mcq", "path": "bench_mcq.jsonl", "metric": "logprob_mcq"},
        ],
    }
    full = write_config(
        folder,
        tiny_config(
            data="train.jsonl",
            project_name="full",
            evals=evals,
            training_config={
                "max_steps": 90,
                "learning_rate": 3e-3,
                "per_device_train_batch_size": 8,
                "save_steps": 90,
                "logging_steps": 30,
            },
        ),
        name="full.yaml",
    )
    full_run, lora_run = train_full_and_lora(folder, full)
    return {"full": full_run, "lora": lora_run, "folder": folder, "config": full}


@pytest.fixture(scope="module")
def exported(runs):
    """The full run exported once to f16, bf16 and q8_0 (two ways of giving the types)."""
    out = runs["folder"] / "gguf-out"
    result = invoke("export", str(runs["full"]), "--gguf", "f16,bf16", "--gguf", "q8_0", "--output", str(out))
    assert result.returncode == 0, result.stderr
    return {
        "folder": out,
        "stderr": result.stderr,
        "files": {t: out / f"full-{t}.gguf" for t in ("f16", "bf16", "q8_0")},
    }


def _hf_model(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        str(folder)
    )


def _logits(model, tokenizer, texts):
    with torch.no_grad():
        return [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in texts]


def test_gguf_files_read_back_with_every_tensor_the_template_and_special_tokens(runs, exported):
    import gguf
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model, tokenizer = _hf_model(runs["full"] / "model")
    weights = {name: tensor.detach() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LFM2, model.config.num_hidden_layers)
    expected = {names.get_name(name, try_suffixes=(".weight", ".bias")): name for name in weights}
    assert None not in expected, "every tensor of the model has a GGUF name"
    for gguf_type, path in exported["files"].items():
        reader = GGUFReader(str(path))
        assert reader.fields["general.architecture"].contents() == "lfm2"
        found = {t.name: t for t in reader.tensors}
        assert set(found) == set(expected), gguf_type  # every tensor, and nothing else (lm_head is tied)
        assert reader.fields["tokenizer.chat_template"].contents() == tokenizer.chat_template
        for key, token in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id),
                           ("padding", tokenizer.pad_token_id)):  # fmt: skip
            assert reader.fields[f"tokenizer.ggml.{key}_token_id"].contents() == token, (gguf_type, key)
        tokens = reader.fields["tokenizer.ggml.tokens"].contents()
        assert len(tokens) == len(tokenizer) and tokens[tokenizer.eos_token_id] == tokenizer.eos_token
        if gguf_type == "q8_0":
            continue
        # float types: each tensor equals the trained one within that type's rounding
        relative = {"f16": 2**-11, "bf16": 2**-8}[gguf_type]
        for gguf_name, hf_name in expected.items():
            tensor = found[gguf_name]
            values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()
            original = weights[hf_name].reshape(values.shape)
            bound = original.abs() * relative + 2**-24 + (6e-8 if gguf_type == "f16" else 0)
            assert ((values - original).abs() <= bound + 1e-12).all(), (gguf_type, hf_name)
    # q8_0 is about half the size of f16
    assert exported["files"]["q8_0"].stat().st_size < 0.6 * exported["files"]["f16"].stat().st_size


def test_f16_logits_match_the_transformers_model_within_f16_rounding(runs, exported):
    from leap_finetune.models.gguf import load_gguf

    model, tokenizer = _hf_model(runs["full"] / "model")
    texts = ["Say teal twice.", tokenizer.apply_chat_template([{"role": "user", "content": "Say gold twice."}],
                                                              tokenize=False, add_generation_prompt=True)]  # fmt: skip
    gguf_model, gguf_tokenizer = load_gguf(exported["files"]["f16"])
    assert [gguf_tokenizer(t).input_ids for t in texts] == [tokenizer(t).input_ids for t in texts]
    original = _logits(model, tokenizer, texts)
    # the transformers model with the tensors the file holds as float16 rounded to float16 (norms and the
    # convolution weights stay float32 there): the GGUF file's logits are the same up to float32 summation order
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LFM2, model.config.num_hidden_layers)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(exported["files"]["f16"])).tensors}
    rounded = model.state_dict()
    for name, tensor in rounded.items():
        if types.get(names.get_name(name, try_suffixes=(".weight", ".bias"))) == "F16":
            rounded[name] = tensor.half().float()
    assert sum(1 for kind in types.values() if kind == "F16") >= len(types) // 2
    model.load_state_dict(rounded)
    as_f16 = _logits(model, tokenizer, texts)
    from_file = _logits(gguf_model, gguf_tokenizer, texts)
    for a, b, c in zip(original, as_f16, from_file):
        assert (b - c).abs().max() < 1e-4
        assert (a - c).abs().max() < 2e-2 * a.abs().max()  # and close to the float32 original


def test_each_file_is_verified_and_the_reported_loss_is_the_eval_difference(runs, exported):
    record = json.loads((exported["folder"] / "quantization.json").read_text())
    assert record["files"] == {t: f"full-{t}.gguf" for t in ("f16", "bf16", "q8_0")}
    benchmarks = {b["name"]: b for b in record["verification"]["benchmarks"]}
    assert set(benchmarks) == {"twice", "twice_mcq"}
    assert benchmarks["twice"]["original"] >= 0.5  # the run learned the task: the comparison means something
    # the loss of q8_0 is the difference of two `leap-finetune eval` results, computed here directly
    scores = {}
    for label, checkpoint in (("original", runs["full"] / "model"), ("q8_0", exported["files"]["q8_0"])):
        out = runs["folder"] / f"eval-{label}.json"
        result = invoke("eval", str(runs["config"]), "--set", f"checkpoint={checkpoint}", "--output", str(out))
        assert result.returncode == 0, result.stderr
        scores[label] = json.loads(out.read_text())["results"]
    for name, bench in benchmarks.items():
        direct = scores["original"][f"benchmark/{name}/score"] - scores["q8_0"][f"benchmark/{name}/score"]
        assert bench["gguf"]["q8_0"]["quantization_loss"] == pytest.approx(direct, abs=1e-9)
        assert bench["original"] == pytest.approx(scores["original"][f"benchmark/{name}/score"], abs=1e-9)
        assert abs(bench["gguf"]["q8_0"]["quantization_loss"]) <= Q8_TOLERANCE
    # the token-level drift: f16 moves the predictions least, bf16 (8 bits of mantissa) and q8_0 more
    drift = record["verification"]["drift"]
    assert drift["f16"]["kl"] < drift["bf16"]["kl"] and drift["f16"]["kl"] < drift["q8_0"]["kl"]
    assert drift["f16"]["top1"] >= drift["q8_0"]["top1"] >= 0.9 and drift["q8_0"]["tokens"] >= 16
    # ... and q8_0's KL is what a direct computation over the same answer tokens gives
    from leap_finetune.config.resolved import ResolvedConfig
    from leap_finetune.config.yaml_io import read_yaml
    from leap_finetune.gguf_export.drift import answer_ids
    from leap_finetune.models.gguf import load_gguf

    resolved = ResolvedConfig.model_validate(read_yaml(runs["full"] / "resolved_config.yaml"))
    model, tokenizer = _hf_model(runs["full"] / "model")
    quantized = load_gguf(exported["files"]["q8_0"])[0]
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, start in answer_ids(resolved, tokenizer):
            p = torch.softmax(model(torch.tensor([ids])).logits[0, start - 1 : -1], -1)
            q = torch.softmax(quantized(torch.tensor([ids])).logits[0, start - 1 : -1], -1)
            total += float((p * (p.log() - q.log())).sum())
            count += p.shape[0]
    assert count == drift["q8_0"]["tokens"]
    assert drift["q8_0"]["kl"] == pytest.approx(total / count, rel=2e-2)  # (float32 rounding of tiny logs)
    # printed as a table, and in the folder's model card with the commands that run each file
    assert "The run's benchmarks on each file" in exported["stderr"] and "q8_0" in exported["stderr"]
    card = (exported["folder"] / "README.md").read_text()
    assert "| model | twice (exact_match) | twice_mcq (logprob_mcq) | KL from original (nats/token) |" in card
    assert "llama-server -m full-q8_0.gguf --port 8080 --jinja" in card  # (the smallest file)
    assert "ollama create" in card and "lms import" in card
    assert not (exported["folder"] / ".transformers").exists()  # the scratch transformers folder is gone


def test_lora_run_exports_merged_and_matches_the_merged_model(runs):
    from peft import PeftModel

    from leap_finetune.models.gguf import load_gguf
    from leap_finetune.models.loading import load_model
    from leap_finetune.models.tiny import load_tiny_tokenizer

    adapter = runs["lora"] / "checkpoint-4"  # an adapter, not merged yet
    out = runs["folder"] / "lora-gguf"
    result = invoke("export", str(adapter), "--gguf", "f32", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "not verified: the run has no benchmarks" in result.stderr
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    merged = PeftModel.from_pretrained(load_model("tiny-lfm2", tokenizer), str(adapter)).merge_and_unload().eval()
    base = load_model("tiny-lfm2", tokenizer).eval()
    gguf_model, gguf_tokenizer = load_gguf(out / "lora-f32.gguf")
    texts = ["Say navy twice.", "Be brief. Say pink twice."]
    for a, b, c in zip(_logits(merged, tokenizer, texts), _logits(gguf_model, gguf_tokenizer, texts),
                       _logits(base, tokenizer, texts)):  # fmt: skip
        assert (a - b).abs().max() < 1e-4  # f32: the merged model itself
        assert (a - c).abs().max() > 1e-2  # (and the adapter changed something)


def test_vision_language_model_writes_the_model_and_its_mmproj(workdir):
    from gguf import GGUFReader

    out = workdir / "vl"
    result = invoke("export", "tiny-lfm2.5-vl", "--gguf", "q8_0", "--output", str(out))
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["README.md", "mmproj-tiny-lfm2.5-vl-f16.gguf", "quantization.json", "tiny-lfm2.5-vl-q8_0.gguf"]
    model = GGUFReader(str(out / "tiny-lfm2.5-vl-q8_0.gguf"))
    assert model.fields["general.architecture"].contents() == "lfm2"
    assert not any("v." in t.name[:2] or "mm." in t.name for t in model.tensors)  # the language model only
    mmproj = GGUFReader(str(out / "mmproj-tiny-lfm2.5-vl-f16.gguf"))
    assert mmproj.fields["general.architecture"].contents() == "clip"
    assert mmproj.fields["clip.projector_type"].contents() == "lfm2"
    names = {t.name for t in mmproj.tensors}
    assert "v.blk.0.attn_q.weight" in names and {"mm.1.weight", "mm.2.weight"} <= names  # encoder, projector
    assert "--mmproj mmproj-tiny-lfm2.5-vl-f16.gguf" in (out / "README.md").read_text()
    # an mmproj file is not a language model to evaluate
    config = write_config(
        workdir,
        {
            "model_name": "tiny-lfm2.5-vl",
            "evals": {"benchmarks": [{"name": "b", "path": "b.jsonl", "metric": "exact_match"}]},
        },
    )
    write_jsonl(
        workdir / "b.jsonl", [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}]
    )
    refused = invoke("eval", str(config), "--set", f"checkpoint={out / 'mmproj-tiny-lfm2.5-vl-f16.gguf'}")
    assert refused.returncode == 2 and "projector (mmproj) file" in refused.stderr


def _nothing_written(folder):
    parent = folder.parent
    return not folder.exists() and not list(parent.glob(f".{folder.name}*"))


def test_mistakes_are_refused_before_anything_is_written(runs, workdir, monkeypatch):
    run = str(runs["full"])
    out = workdir / "out"
    cases = [
        (("export", str(workdir / "nowhere"), "--gguf", "q8_0", "-o", str(out)), "no such folder"),
        (("export", run, "--gguf", "q9_x", "-o", str(out)), "unknown GGUF type 'q9_x'"),
        (("export", run, "--gguf", "q4_k_m", "--llama-cpp", str(workdir), "-o", str(out)), "no llama-quantize"),
        (("export", run, "--gguf", "auto,q8_0", "-o", str(out)), "takes no other type beside it"),
        (("export", run, "--gguf", "auto", "--no-verify", "-o", str(out)), "--no-verify skips them"),
        (("export", run, "--gguf", "auto", "--max-drop", "-1", "-o", str(out)), "--max-drop is -1.0: expected"),
        (("export", run, "--gguf", "q8_0", "--max-kl", "0.1", "-o", str(out)), "go with --gguf auto"),
        (("export", run, "--max-drop", "0.1", "-o", str(out)), "go with --gguf"),
        (("export", run, "--gguf-adapter", "-o", str(out)), "go with --gguf"),
        (("export", run, "--gguf", "q8_0", "--gguf-adapter", "-o", str(out)), "there is none here"),
        (
            (
                "export",
                str(runs["lora"]),
                "--gguf",
                "q8_0",
                "--gguf-adapter",
                "--llama-cpp",
                str(workdir),
                "-o",
                str(out),
            ),
            "needs llama.cpp's convert_lora_to_gguf.py",
        ),
    ]
    for args, said in cases:
        result = invoke(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert said in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert _nothing_written(out)
    # a k-quant with no llama-quantize on PATH: says how to get it
    monkeypatch.setenv("PATH", str(workdir))
    result = invoke("export", run, "--gguf", "q4_k_m", "-o", str(out))
    assert result.returncode == 2 and "llama-quantize, which is not on PATH" in result.stderr
    assert "scripts/build_llama_cpp.sh" in result.stderr and _nothing_written(out)
    monkeypatch.undo()
    # --llama-cpp without --gguf
    result = invoke("export", run, "--llama-cpp", str(workdir), "-o", str(out))
    assert result.returncode == 2 and "go with --gguf" in result.stderr and _nothing_written(out)
    # an unwritable target: a file where the folder's parent should be; a folder that is not empty
    (workdir / "a-file").write_text("x")
    result = invoke("export", run, "--gguf", "q8_0", "-o", str(workdir / "a-file" / "out"))
    assert result.returncode == 2 and "is a file" in result.stderr
    (workdir / "full").mkdir()
    (workdir / "full" / "keep.txt").write_text("mine")
    result = invoke("export", run, "--gguf", "q8_0", "-o", str(workdir / "full"))
    assert result.returncode == 2 and "not empty" in result.stderr
    assert [p.name for p in (workdir / "full").iterdir()] == ["keep.txt"]
    # a folder without a model
    (workdir / "empty").mkdir()
    result = invoke("export", str(workdir / "empty"), "--gguf", "q8_0", "-o", str(out))
    assert result.returncode == 2 and "no model here" in result.stderr and _nothing_written(out)


def test_a_full_disk_is_refused_with_the_space_needed(runs, workdir):
    small = workdir / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        result = invoke("export", str(runs["full"]), "--gguf", "f16", "-o", str(small / "out"))
        assert result.returncode == 2, result.stderr
        assert "not enough disk space" in result.stderr and "another disk" in result.stderr
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_killed_before_the_swap_leaves_nothing_and_a_rerun_succeeds(runs, workdir):
    out = workdir / "killed"
    killed = start_cli(
        "export",
        str(runs["lora"] / "checkpoint-4"),
        "--gguf",
        "q8_0",
        "-o",
        str(out),
        cwd=workdir,
        fault="gguf-written=SIGKILL",
    )
    communicate(killed, what="export --gguf")
    assert killed.returncode == -9
    assert not out.exists()
    assert (workdir / ".killed.partial" / "lora-q8_0.gguf").is_file()  # killed after writing, before the rename
    again = invoke("export", str(runs["lora"] / "checkpoint-4"), "--gguf", "q8_0", "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "lora-q8_0.gguf", "quantization.json"]
    assert not list(workdir.glob(".killed*"))  # the rerun cleared what the killed one left


def test_no_verify_into_a_folder_that_does_not_exist_yet(runs, workdir):
    out = workdir / "new" / "sub" / "out"
    result = invoke("export", str(runs["full"]), "--gguf", "q8_0", "--no-verify", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "not verified: --no-verify was given" in result.stderr and "verifying" not in result.stderr
    record = json.loads((out / "quantization.json").read_text())
    assert record["verification"]["skipped"] == "--no-verify was given" and (out / "full-q8_0.gguf").is_file()


def test_without_llama_bench_the_speed_is_said_not_measured(exported):
    assert "device speed: not measured (llama-bench not found" in " ".join(exported["stderr"].split())
    record = json.loads((exported["folder"] / "quantization.json").read_text())
    assert record["device"]["skipped"].startswith("llama-bench not found")
    assert "## Speed on a CPU" in (exported["folder"] / "README.md").read_text()
    assert record["serving_parity"]["skipped"].startswith("llama-server not found")


def test_the_first_difference_of_two_renderings_is_located():
    from leap_finetune.gguf_export.parity import first_difference

    assert first_difference("abc", "abc") is None
    found = first_difference('{"name": "f"}' + "x" * 40, '{"name": "f", "description": ""}' + "x" * 40)
    assert found["at"] == len('{"name": "f"')
    assert found["ours"].startswith('{"name": "f"}') and found["server"].startswith('{"name": "f", "descr')
    assert first_difference("abc", "abcd")["at"] == 3  # (one is the other's beginning)


def test_auto_keeps_the_smallest_file_within_the_bounds_and_says_why_each_other_is_not(exported):
    """gguf_export/auto.py's choice on real files (their sizes) with scores and KL set per case: the smallest file
    that passes both bounds wins; a drop or a KL over its bound, or a file not scored, is the reason given."""
    from leap_finetune.gguf_export.auto import choose
    from leap_finetune.gguf_export.verify import ORIGINAL, Verification

    files = {t: exported["files"][t] for t in ("bf16", "q8_0")}  # (q8_0 is the smaller)
    verification = Verification([("twice", "exact_match"), ("twice_mcq", "logprob_mcq")])
    verification.scores = {
        ORIGINAL: {"twice": 1.0, "twice_mcq": 1.0},
        "bf16": {"twice": 1.0, "twice_mcq": 1.0},
        "q8_0": {"twice": 0.97, "twice_mcq": 1.0},
    }
    verification.drift = {"bf16": {"kl": 0.0, "top1": 1.0}, "q8_0": {"kl": 1e-3, "top1": 1.0}}
    assert choose(verification, files, max_drop=0.05, max_kl=0.05).chosen == "q8_0"
    tight = choose(verification, files, max_drop=0.02, max_kl=0.05)
    assert tight.chosen == "bf16" and tight.rungs[1]["why_not"] == "twice drops 0.0300 > 0.02"
    assert choose(verification, files, max_drop=0.05, max_kl=1e-4).rungs[1]["why_not"] == "KL 1.00e-03 > 0.0001"
    none = choose(verification, files, max_drop=0.0, max_kl=0.0)
    assert none.chosen == "bf16"  # (exactly the original: a drop of 0 and a KL of 0 pass a bound of 0)
    verification.unread = {"q8_0": "a block type transformers lacks"}
    del verification.scores["q8_0"]
    unread = choose(verification, files, max_drop=1.0, max_kl=1.0)
    assert unread.chosen == "bf16" and "not measured here" in unread.rungs[1]["why_not"]


def test_checkpoints_are_exported_scored_and_compared_side_by_side(runs, workdir):
    """--checkpoints: each intact checkpoint and the final model exported and scored like one export, in folders
    of their own, with checkpoints.json (per file: mean score, speed) and checkpoints.png; a run with fewer than two
    is refused."""
    out = workdir / "ck"
    result = invoke("export", str(runs["full"]), "--gguf", "q8_0", "--checkpoints", "--no-speed", "-o", str(out))
    assert result.returncode == 0, result.stderr
    rows = json.loads((out / "checkpoints.json").read_text())
    assert [r["model"] for r in rows] == ["checkpoint-90", "final"] and rows[0]["step"] == 90
    for row in rows:
        assert (out / row["files"]["q8_0"]["file"]).is_file() and 0 <= row["files"]["q8_0"]["mean_score"] <= 1
    assert (out / "checkpoints.png").stat().st_size > 0 and (out / "final" / "quantization.json").is_file()
    model_only = workdir / "model-only"
    result = invoke("export", str(runs["full"] / "model"), "--gguf", "q8_0", "--checkpoints", "-o", str(model_only))
    assert result.returncode == 2 and "has 0 to export" in result.stderr
