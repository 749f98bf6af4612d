"""The original system's configs (Liquid4All's leap-finetune / liquid-finetune): each of its keys is read with the
same meaning (and a note naming ours) or refused naming ours and the value to write; `leap-finetune migrate` writes
the converted file with a comment per change, and the file it writes validates. docs/migrating.md lists every key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from leap_finetune.config.legacy import translate
from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import REPO, invoke, write_jsonl

# A ColBERT job of the original system as it wrote them (its tests/e2e/fixtures/e2e_colbert.yaml, with its
# retrieval loss settings and a SLURM block)
ORIGINAL_COLBERT = {
    "project_name": "e2e_colbert",
    "model_name": "tiny-lfm2",
    "training_type": "colbert",
    "dataset": {"train_path": "retrieval.jsonl", "type": "colbert", "test_size": 0.2, "hf_streaming_batch_size": 100},
    "training_config": {
        "extends": "DEFAULT_COLBERT",
        "max_steps": 2,
        "loss": "cached_contrastive",
        "mini_batch_size": 4,
        "temperature": 0.02,
        "gather_across_devices": True,
    },
    "peft_config": {"use_peft": False},
    "slurm": {
        "job_name": "e2e_colbert_1gpu",
        "nodes": 1,
        "ntasks_per_node": 1,
        "gpus_per_task": 2,
        "cpus_per_gpu": 8,
        "output": "logs/OUT_%x.%j",
        "error": "logs/ERR_%x.%j",
        "directives": ["--partition=gpuworker", "--time=01:00:00", "--qos=high"],
        "setup_commands": ["source venv/bin/activate"],
    },
}


def _retrieval_data(folder: Path) -> None:
    rows = [{"query": f"word {i}", "positive": f"The document about {i}.", "negative": f"Not {i}."} for i in range(20)]
    write_jsonl(folder / "retrieval.jsonl", rows)


def test_an_original_colbert_job_is_read_with_the_same_meaning_and_migrated(workdir):
    _retrieval_data(workdir)
    old = workdir / "old.yaml"
    old.write_text(yaml.safe_dump(ORIGINAL_COLBERT), encoding="utf-8")
    resolved = load_config(old)  # read as it is: each original key a note
    notes = " ".join(resolved.config_notes)
    assert (
        "training_config.loss: cached_contrastive (the original system's key) is retrieval.loss: cached_mnrl" in notes
    )
    assert "key(s) of the original system read as ours; `leap-finetune migrate CONFIG` rewrites the file" in notes
    assert (resolved.retrieval.loss, resolved.retrieval.temperature) == ("cached_mnrl", 0.02)
    assert (resolved.retrieval.mini_batch_size, resolved.retrieval.gather_across_devices) == (4, True)
    slurm = resolved.slurm
    assert (slurm.partition, slurm.time, slurm.gpus_per_node, slurm.cpus_per_task) == ("gpuworker", "01:00:00", 2, 16)
    assert slurm.extra_sbatch == ["--qos=high"] and slurm.setup == ["source venv/bin/activate"]
    assert resolved.dataset.path.endswith("retrieval.jsonl")

    result = invoke("migrate", str(old), cwd=workdir)
    assert result.returncode == 0, result.stderr
    new = workdir / "old.migrated.yaml"
    text = new.read_text()
    assert "# migrate: was training_config.loss: cached_contrastive" in text
    assert "# removed: slurm.output:" in text and "# removed: dataset.hf_streaming_batch_size:" in text
    lines = text.splitlines()  # the comment sits above the key it explains
    assert lines[lines.index("  loss: cached_mnrl") - 1].lstrip().startswith("# migrate: was training_config.loss")
    migrated = load_config(new)
    assert not any("original system" in note for note in migrated.config_notes)  # nothing of the old left
    assert migrated.retrieval == resolved.retrieval and migrated.slurm == resolved.slurm
    assert "wrote " in result.stderr and "next: leap-finetune validate" in result.stderr
    again = invoke("migrate", str(old), cwd=workdir)  # never over an existing file
    assert again.returncode == 2 and "the file exists" in again.stderr


def test_each_original_key_becomes_ours():
    original = {
        "job_name": "vision-job",
        "model_name": "tiny-lfm2.5-vl",
        "training_type": "vlm_sft",
        "config_dir": "/somewhere",
        "dataset": {"train_path": "rows.jsonl", "type": "vlm_sft", "train_split": "train", "train_subset": "en",
                    "cache_dataset": True, "image_root": "pictures"},
        "training_config": {"base": "DEFAULT_VLM_SFT", "adapter_path": "adapter", "chat_template_path": "t.jinja",
                            "output_dir": "out", "freeze_vision_encoder": True, "max_image_tokens": 256,
                            "do_image_splitting": False,
                            "lr_multipliers": {"model.vision_tower": 0.1, "model.multi_modal_projector": 1.0},
                            "qat": {"type": "gguf_q8_0", "quantize_reference": True}},
        "benchmarks": {"best_checkpoint_metrics": {"charts": 1.0},
                       "benchmarks": [{"name": "charts", "path": "b.jsonl", "metric": "exact_match"}]},
    }  # fmt: skip
    converted, changes = translate(original)
    assert converted == {
        "model_name": "tiny-lfm2.5-vl",
        "training_type": "sft",
        "dataset": {"path": "rows.jsonl", "type": "sft", "split": "train", "subset": "en", "cache": True,
                    "image_root": "pictures"},
        "training_config": {"extends": "DEFAULT_VLM_SFT", "train_vision_encoder": False,
                            "vision_encoder_lr_multiplier": 0.1, "metric_for_best_model": "benchmark/charts"},
        "evals": {"benchmarks": [{"name": "charts", "path": "b.jsonl", "metric": "exact_match"}]},
        "project_name": "vision-job",
        "adapter_path": "adapter",
        "chat_template": "t.jinja",
        "image_processor": {"max_image_tokens": 256, "do_image_splitting": False},
        "qat": {"target": "q8_0"},
    }  # fmt: skip
    assert not any(c.refused for c in changes)
    assert original["training_type"] == "vlm_sft"  # (the mapping given is not changed)
    assert translate(converted)[1] == []  # ours stays ours
    grpo, _ = translate({"training_type": "vlm_grpo", "dataset": {"path": "p.jsonl", "type": "vlm_grpo"}})
    assert grpo == {"training_type": "grpo", "dataset": {"path": "p.jsonl", "type": "grpo"}}


def test_the_original_format_example_runs_as_it_is_and_migrates(tmp_path):
    """examples/original/sft_job.yaml: read with a note per original key; migrated, the same config in ours."""
    import shutil

    folder = tmp_path / "examples"
    shutil.copytree(REPO / "examples" / "original", folder / "original")
    shutil.copytree(REPO / "examples" / "data", folder / "data")
    old = folder / "original" / "sft_job.yaml"
    resolved = load_config(old)
    assert resolved.training["metric_for_best_model"] == "benchmark/capitals" and resolved.slurm.partition == "gpu"
    assert invoke("migrate", str(old), cwd=tmp_path).returncode == 0
    migrated = load_config(folder / "original" / "sft_job.migrated.yaml")
    assert migrated.training == resolved.training and migrated.slurm == resolved.slurm
    assert migrated.evals == resolved.evals and migrated.project_name == "original-format"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"training_type": "grpo", "rewards": {"recipe": "tasks/gsm8k/recipe.py::GSM8KRecipe"}},
         "rewards: {funcs: [rewards.py::my_reward]}"),
        ({"training_config": {"qat": {"type": "mlx_q4"}}}, "write qat: {target: q4_0}"),
        ({"training_config": {"lr_multipliers": {"model.multi_modal_projector": 0.5}}},
         "training_config.vision_encoder_lr_multiplier"),
        ({"dataset": {"path": "train.jsonl", "val_split": "validation"}}, "set dataset.val_path to it"),
        ({"modal": {"gpu": "H100"}}, "leap-finetune slurm"),
        ({"model_config": {"attn_implementation": "sdpa"}}, "training_config.model_init_kwargs"),
        ({"evals": {"best_checkpoint_metrics": {"a": 0.5, "b": 0.5},
                    "benchmarks": [{"name": "a", "path": "a.jsonl", "metric": "exact_match"},
                                   {"name": "b", "path": "b.jsonl", "metric": "exact_match"}]}},
         "metric_for_best_model: benchmark/NAME (one of: benchmark/a, benchmark/b)"),
        ({"training_type": "embedding", "training_config": {"prompts": {"query": "q: ", "positive": "p: ",
                                                                        "negative": "n: "}}},
         "retrieval.prompts: {query: 'q: ', document: 'p: '}"),
    ],
)  # fmt: skip
def test_original_keys_without_our_meaning_are_refused_naming_ours(workdir, change, said):
    write_jsonl(workdir / "train.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    config = {"model_name": "tiny-lfm2", "dataset": {"path": "train.jsonl"}, **change}
    with pytest.raises(LeapError) as err:
        load_config(config, base_dir=workdir)
    text = " ".join(err.value.format().split())
    assert "the original system's key" in text and said in text, text


def test_migrate_writes_what_it_can_and_marks_what_needs_the_user(workdir):
    old = workdir / "grpo.yaml"
    old.write_text(yaml.safe_dump({"model_name": "tiny-lfm2", "training_type": "grpo", "job_name": "math",
                                   "dataset": {"path": "p.jsonl", "type": "grpo"},
                                   "rewards": {"recipe": "tasks/gsm8k/recipe.py::GSM8KRecipe"}}))  # fmt: skip
    result = invoke("migrate", str(old), "--output", str(workdir / "new.yaml"), cwd=workdir)
    assert result.returncode == 2 and "1 key(s) of" in result.stderr
    written = yaml.safe_load((workdir / "new.yaml").read_text())
    assert written["project_name"] == "math" and written["rewards"] == {"recipe": "tasks/gsm8k/recipe.py::GSM8KRecipe"}
    assert "# NEEDS YOU: rewards.recipe:" in (workdir / "new.yaml").read_text()
    assert invoke("migrate", str(old), "--output", str(old), cwd=workdir).returncode == 2  # not over itself


def test_a_change_in_a_list_entry_is_marked_above_that_entry_s_key(workdir):
    """Was: the comments for every dataset of a list landed above the first dataset's key (and an entry that is a
    plain path was not counted)."""
    old = workdir / "sft.yaml"
    datasets = ["x.jsonl"] + [{"path": f"{name}.jsonl", "train_split": "train"} for name in "ab"]
    old.write_text(yaml.safe_dump({"model_name": "tiny-lfm2", "training_type": "sft", "project_name": "m",
                                   "dataset": datasets}))  # fmt: skip
    assert invoke("migrate", str(old), "--output", str(workdir / "new.yaml"), cwd=workdir).returncode == 0
    lines = (workdir / "new.yaml").read_text().splitlines()
    splits = [i for i, line in enumerate(lines) if line.strip() == "split: train"]
    assert lines[splits[0] - 1].strip().startswith("# migrate: was dataset[1].train_split:")
    assert lines[splits[1] - 1].strip().startswith("# migrate: was dataset[2].train_split:")
    assert lines[splits[1] - 2].strip() == "- path: b.jsonl"


def test_docs_list_every_original_key():
    """docs/migrating.md has a row for each original key the translation knows (refused ones too)."""
    import inspect

    from leap_finetune.config import legacy

    docs = (REPO / "docs" / "migrating.md").read_text()
    source = inspect.getsource(legacy)
    keys = {"training_type: vlm_sft", "training_type: vlm_dpo", "training_type: moe_sft", "training_type: moe_dpo",
            "training_type: vlm_grpo", "job_name", "benchmarks", "config_dir", "modal", "kuberay", "rl_env",
            "model_config", "dataset.train_path", "dataset.train_split", "dataset.train_subset",
            "dataset.cache_dataset", "dataset.hf_streaming_batch_size", "dataset.val_split", "dataset.val_subset",
            "dataset.image_root", "training_config.loss", "training_config.prompts", "training_config.temperature",
            "training_config.mini_batch_size", "training_config.gather_across_devices", "training_config.base",
            "training_config.adapter_path", "training_config.chat_template_path", "training_config.output_dir",
            "training_config.freeze_vision_encoder", "training_config.lr_multipliers",
            "training_config.max_image_tokens", "training_config.do_image_splitting", "training_config.qat",
            "evals.best_checkpoint_metrics", "evals.image_root", "async_eval.dtype", "async_eval.max_model_len",
            "async_eval.failure.max_submit_attempts", "async_eval.failure.submit_retry_backoff",
            "slurm.gpus_per_task", "slurm.ntasks_per_node", "slurm.cpus_per_gpu", "slurm.setup_commands",
            "slurm.directives", "slurm.output", "slurm.error", "rewards.recipe"}  # fmt: skip
    missing = sorted(k for k in keys if f"`{k}`" not in docs)
    assert not missing, missing
    for name in ("train_path", "hf_streaming_batch_size", "freeze_vision_encoder", "best_checkpoint_metrics"):
        assert name in source  # (the keys above are the ones the translation handles)


@pytest.mark.parametrize(("kind", "default_scale"), [("embedding", 20.0), ("colbert", 1.0)])
def test_retrieval_temperature_is_the_losses_scale(workdir, kind, default_scale):
    """retrieval.temperature divides the similarities (sentence-transformers' scale = 1/temperature); unset, the
    loss's own scale."""
    from rich.console import Console

    from leap_finetune.models.encoders import build_colbert_model, build_embedding_model
    from leap_finetune.recipes import colbert, embedding

    _retrieval_data(workdir)
    build = {"embedding": build_embedding_model, "colbert": build_colbert_model}[kind]
    recipe = {"embedding": embedding, "colbert": colbert}[kind]
    for temperature, scale in ((0.02, 50.0), (None, default_scale)):
        retrieval = {"loss": "cached_mnrl", "mini_batch_size": 2} | (
            {"temperature": temperature} if temperature else {}
        )
        config = {"model_name": "tiny-lfm2", "training_type": kind, "dataset": {"path": "retrieval.jsonl"},
                  "retrieval": retrieval}  # fmt: skip
        resolved = load_config(config, base_dir=workdir).model_copy(update={"run_dir": str(workdir / kind)})
        model = build(resolved, Console(quiet=True))
        loss = recipe.build_loss(resolved, model)
        assert loss.scale == pytest.approx(scale)
        assert loss.gather_across_devices is False  # one process: nothing to gather


@pytest.mark.parametrize(
    "odd",
    [
        {"training_type": ["sft"]},
        {"dataset": {"path": "train.jsonl", "type": ["sft"]}},
        {"slurm": {"gpus_per_node": "8", "cpus_per_gpu": 4}},
        {"evals": {"best_checkpoint_metrics": 3, "benchmarks": []}},
        {"training_type": "embedding", "training_config": {"loss": ["x"], "prompts": {"query": ["q"]}}},
        {"training_config": {"qat": {"type": [1]}, "freeze_vision_encoder": "yes", "lr_multipliers": {"a": [1]}}},
    ],
)
def test_odd_values_are_said_as_errors_not_tracebacks(workdir, odd):
    """Reading the original's keys runs before the schema on every config: a value of an unexpected type is left for
    the schema (or refused), never a TypeError."""
    write_jsonl(workdir / "train.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    try:  # (a value the schema takes - slurm's "8" - loads; any other is a LeapError)
        load_config({"model_name": "tiny-lfm2", "dataset": {"path": "train.jsonl"}, **odd}, base_dir=workdir)
    except LeapError:
        pass


def test_the_originals_prompt_defaults_and_profiles_are_kept():
    converted, _ = translate({"training_type": "embedding", "training_config": {"prompts": {"query": "search: "}}})
    assert converted["retrieval"]["prompts"] == {"query": "search: ", "document": "document: "}
    converted, _ = translate({"training_type": "vlm_grpo", "training_config": {"extends": "DEFAULT_VLM_GRPO"}})
    assert converted["training_config"]["extends"] == "DEFAULT_GRPO"
