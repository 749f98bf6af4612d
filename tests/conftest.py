"""Shared fixtures. Nothing here touches the network: tests use the built-in tiny models."""

from __future__ import annotations

import functools
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# One torch thread per process (before torch is imported; the processes a test starts inherit it): the test processes
# share 2 cores, and torch's two threads per process would stall at every parallel region whenever the other process
# runs (measured: a 30-step tiny run 8.4 s -> 2.6 s beside a busy process; alone, the same 1.8-2.0 s either way).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["COLUMNS"] = "200"  # rich wraps at the terminal width; messages are asserted whole
# Library FutureWarnings are shown in the test summary (in-process runs), not hidden as for users.
os.environ["LEAP_FINETUNE_SHOW_WARNINGS"] = "1"
# The prepared-data cache of this test session (not the user's ~/.cache); tests of the cache set their own.
if "LEAP_FINETUNE_CACHE" not in os.environ:
    import tempfile

    os.environ["LEAP_FINETUNE_CACHE"] = tempfile.mkdtemp(prefix="leap-test-cache-")

# After the environment above: huggingface_hub reads HF_HUB_OFFLINE when it is first imported.
from transformers import TrainerCallback  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def row_texts(rows) -> list[str]:
    """The text of each prepared SFT row (its token ids decoded: the byte-level tokenizer gives the rendered
    text back exactly)."""
    from leap_finetune.models.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    return [tokenizer.decode(ids) for ids in rows.column("input_ids")]


def chat(user: str, answer: str, system: str | None = None) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return {"messages": messages}


def write_config(folder: Path, config: dict, name: str = "config.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def grpo_rows_config(folder, rows: list[dict], rewards: list) -> dict:
    """GRPO on tiny-lfm2 over `rows` (written to folder/g.jsonl) scored by `rewards`: the config the tests of rows'
    solutions validate (own sampler, 2 generations of 2 prompts, GRPO's profile without max_length)."""
    write_jsonl(folder / "g.jsonl", rows)
    config = tiny_config(
        data="g.jsonl", training_type="grpo", rewards=rewards,
        training_config={"extends": "DEFAULT_GRPO", "use_vllm": False, "num_generations": 2,
                         "per_device_train_batch_size": 2},
    )  # fmt: skip
    del config["training_config"]["max_length"]
    return config


def tiny_config(data: str = "train.jsonl", **overrides) -> dict:
    """A config that trains tiny-lfm2 for a few steps on CPU."""
    config = {
        "project_name": "test",
        "model_name": "tiny-lfm2",
        "training_type": "sft",
        "dataset": {"path": data},
        "training_config": {
            "extends": "DEFAULT_SFT",
            "max_steps": 6,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_steps": 40,
            "max_length": 128,
            "warmup_steps": 0,
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def fact_rows(n: int = 40) -> list[dict]:
    """A deterministic learnable task."""
    words = ["red", "blue", "green", "gold", "pink", "gray", "teal", "navy"]
    rows = []
    for i in range(n):
        w = words[i % len(words)]
        rows.append(chat(f"Say {w} twice.", f"{w} {w}", system="Be brief." if i % 2 else None))
    return rows


def train_full_and_lora(folder: Path, full_config: Path) -> tuple[Path, Path]:
    """Trains `full_config` (project `full`) and a short LoRA run (project `lora`, 8 steps, a checkpoint every 4) on
    folder/train.jsonl through the CLI; returns the two run folders."""
    lora = write_config(
        folder,
        {
            **tiny_config(
                data="train.jsonl",
                project_name="lora",
                training_config={"max_steps": 8, "learning_rate": 1e-2, "save_steps": 4},
            ),
            "peft_config": {"extends": "DEFAULT_LORA", "r": 8},
        },
        name="lora.yaml",
    )
    for config in (full_config, lora):
        result = invoke(str(config), cwd=folder)
        assert result.returncode == 0, result.stderr
    [full_run] = list((folder / "outputs" / "full").iterdir())
    [lora_run] = list((folder / "outputs" / "lora").iterdir())
    return full_run, lora_run


def hub_cache_with_tiny_model(cache: Path, repo: str) -> Path:
    """A Hugging Face cache holding `repo` as a download leaves it (refs/main, snapshots/SHA): the tiny
    tokenizer and config."""
    import torch

    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    folder = cache / f"models--{repo.replace('/', '--')}"
    sha = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(sha)
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    tokenizer.save_pretrained(folder / "snapshots" / sha)
    with torch.device("meta"):
        build_tiny_model("tiny-lfm2", tokenizer).config.save_pretrained(folder / "snapshots" / sha)
    return cache


def run_cli(*args: str, cwd: Path, cpu_s: float = 3600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed CLI as a user runs it, under a watchdog (tests/watchdog.py): it fails when the run hangs,
    not when a loaded machine makes it slow. `env`: variables added to this process's."""
    from tests.watchdog import run

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200", **(env or {})}
    env.pop("LEAP_FINETUNE_SHOW_WARNINGS", None)
    return run(
        [sys.executable, "-m", "leap_finetune.cli", *args],
        what=f"leap-finetune {' '.join(args)}",
        cpu_s=cpu_s,
        cwd=cwd,
        env=env,
    )


class StopAt(TrainerCallback):
    """Simulates an interruption: save and stop after `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True


def invoke(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI's entry point (`leap_finetune.cli.main`, what the console script calls) run in this
    process, with its exit code and output: the same code path as `run_cli` without ~10 s of imports
    per call. Bugs (exceptions other than user errors) propagate and fail the test."""
    import contextlib
    import io

    from leap_finetune.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(["leap-finetune", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def examples(workdir) -> Path:
    """A copy of examples/ in the test's folder: runs go to outputs/ beside the config, as for users."""
    import shutil

    return Path(shutil.copytree(EXAMPLES, workdir / "examples", ignore=shutil.ignore_patterns("outputs")))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A temporary folder that is also the current folder (runs go to ./outputs)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.hookimpl(tryfirst=True)  # (before pytest-xdist's own hook reads the groups set here)
def pytest_collection_modifyitems(config, items):
    """Every test that starts the SLURM cluster is marked `slurm` (pytest -m 'not slurm' leaves them out): by its
    fixture, so a new one cannot be forgotten. The `llama_cpp` lane (it builds llama.cpp, minutes the first time)
    runs only when asked for: `pytest -m llama_cpp`; otherwise its tests are deselected (not skipped)."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
    if "llama_cpp" not in (config.option.markexpr or ""):
        lane = [item for item in items if item.get_closest_marker("llama_cpp")]
        if lane:
            config.hook.pytest_deselected(items=lane)
            items[:] = [item for item in items if not item.get_closest_marker("llama_cpp")]
    _group_for_two_processes(config, items)


def _group_for_two_processes(config, items) -> None:
    """The test processes that share the machine (pytest-xdist: `-n 2` in pyproject.toml) take whole files (see
    pytest_xdist_make_scheduler); here, in each process's collection, the files with the most end-to-end runs go
    first, so that no long file starts last and keeps one process busy alone at the end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # (one process: the files in the order collected)
    weights: dict[str, float] = {}
    waiting = set()
    for item in items:
        group = _group_of(config.rootpath, item.path)
        weights[group] = weights.get(group, 0) + (1 if item.get_closest_marker("slow") else 0)
        if item.get_closest_marker("network"):
            waiting.add(group)
    # A file that mostly waits (on PyPI) goes second, to the other process while the heaviest file (the Ray runs,
    # several processes each) runs: they use the CPU it leaves idle. At the end it left a core idle (~12 s).
    top = max((weight for group, weight in weights.items() if group not in waiting), default=0)
    for group in waiting:
        weights[group] = top - 0.5
    items.sort(key=lambda item: -weights[_group_of(config.rootpath, item.path)])  # (stable: a file's order kept)


@functools.cache
def _group_of(root: Path, path: Path) -> str:
    """The unit of work of one test process: a test file (its module fixtures - a Ray instance, a trained run - are
    made once), and one unit for every file that starts SLURM jobs (the one-node cluster has 2 CPUs: jobs of two files
    at once would wait on each other, and a waiting job looks hung to its test's watchdog)."""
    path = Path(path)
    if "slurm_cluster" in path.read_text(encoding="utf-8"):
        return "slurm"
    return path.relative_to(root).as_posix()


def pytest_xdist_make_scheduler(config, log):
    """Whole test files to each process (`_group_of`), in the order the processes collected them. (pytest-xdist's
    `--dist loadgroup` would do it with xdist_group marks, but it renames test ids in a way pytest 9.2 ignores.)"""
    from xdist.scheduler import LoadScopeScheduling

    class WholeFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(config.rootpath, config.rootpath / nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False  # (the order of _group_for_two_processes)
    return WholeFiles(config, log)


# Python's cyclic garbage collector, in a test process that lives for hundreds of tests, walks every object alive at
# each full collection - torch's, transformers' and TRL's modules included - and full collections come often (each
# Trainer.train() asks for one): measured, 22% of a test process's time on the end-to-end files. What is alive once
# the tests are collected, and again after each test file, lives for the rest of the session: frozen (gc.freeze),
# the collector leaves it out (44 tests of tests/e2e: 50.9 s -> 39.5 s, collection time 11.1 s -> 2.6 s).
def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # (after the file's fixtures are finalized: what they held is garbage now, collected before the freeze)
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()
