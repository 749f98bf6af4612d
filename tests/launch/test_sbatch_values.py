"""`slurm.extra_sbatch` values in SLURM's formats, checked by leap-finetune itself as slurm.time and slurm.mem are: on
a login node without `sbatch` (no `--test-only` to ask) `--time=forever` was written into the script, and the job
would only have been refused on the cluster."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import EXAMPLES, invoke, write_config

QUICK = {
    "project_name": "audit",
    "model_name": "tiny-lfm2",
    "training_type": "sft",
    "dataset": {"path": "data/quickstart.jsonl", "test_size": 0.15},
    "training_config": {"max_steps": 2, "per_device_train_batch_size": 4, "max_length": 128},
}


@pytest.fixture
def no_sbatch(workdir, monkeypatch):
    """A PATH that holds no sbatch (the test machine has SLURM installed)."""
    shutil.copytree(EXAMPLES / "data", workdir / "data")
    monkeypatch.setenv("PATH", str(workdir))
    assert shutil.which("sbatch") is None
    return workdir


@pytest.mark.parametrize(
    ("extra", "expected", "fix"),
    [
        (["--time=forever", "--mem=lots"], "slurm.extra_sbatch[0] --time is 'forever': expected a SLURM time limit",
         "e.g. --time=04:00:00"),
        (["--qos=high", "--mem=lots"], "slurm.extra_sbatch[1] --mem is 'lots': expected a whole amount with K, M, G",
         "e.g. --mem=200G"),
        (["-t forever"], "slurm.extra_sbatch[0] -t is 'forever': expected a SLURM time limit", "e.g. -t 04:00:00"),
        (["--mem-per-cpu=4GB"], "slurm.extra_sbatch[0] --mem-per-cpu is '4GB': expected a whole amount",
         "e.g. --mem-per-cpu=200G"),
        (["--mem-per-gpu 8x"], "slurm.extra_sbatch[0] --mem-per-gpu is '8x'", "e.g. --mem-per-gpu=200G"),
        (["-p gpu:a100"], "slurm.extra_sbatch[0] -p is 'gpu:a100': expected a partition name", "e.g. -p gpu"),
        (["--partition=gpu:a100"], "slurm.extra_sbatch[0] --partition is 'gpu:a100'", "e.g. --partition=gpu"),
        (["--gres=gpu:a100:four"], "slurm.extra_sbatch[0] --gres is 'gpu:a100:four': expected generic resources",
         "e.g. --gres=gpu:4"),
    ],
)  # fmt: skip
def test_extra_sbatch_values_in_no_slurm_format_are_refused_without_sbatch(no_sbatch, extra, expected, fix):
    config = write_config(no_sbatch, {**QUICK, "slurm": {"extra_sbatch": extra}})
    for command in ("validate", "slurm"):
        result = invoke(command, str(config), cwd=no_sbatch)
        said = " ".join(result.stderr.split())
        assert result.returncode == 2 and "Traceback" not in said, (command, said)
        assert expected in said and f"fix: {fix}" in said, (command, said)
    assert not (no_sbatch / "outputs").exists()  # (no script written)


def test_extra_sbatch_values_in_slurm_formats_are_written_without_sbatch(no_sbatch):
    extra = ["--time=1-00:00:00", "-t 90", "--mem-per-gpu=80G", "--mem=0", "-p gpu,debug", "--gres=gpu:a100:2",
             "--qos=high"]  # fmt: skip
    config = write_config(no_sbatch, {**QUICK, "slurm": {"extra_sbatch": extra}})
    result = invoke("slurm", str(config), cwd=no_sbatch)
    assert result.returncode == 0, result.stderr
    assert "sbatch is not installed here: copy it" in " ".join(result.stderr.split())
    [script] = (no_sbatch / "outputs" / "audit" / "slurm").glob("*.sbatch")
    text = script.read_text()
    assert all(f"#SBATCH {entry}\n" in text for entry in extra), text
