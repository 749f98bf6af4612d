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
    extra = ["--mem-per-gpu=80G", "--mem=0", "-p gpu,debug", "--gres=gpu:a100:2", "--qos=high", "-c 8",
             "--gpus-per-task=a100:1"]  # fmt: skip
    config = write_config(no_sbatch, {**QUICK, "slurm": {"extra_sbatch": extra}})
    result = invoke("slurm", str(config), cwd=no_sbatch)
    assert result.returncode == 0, result.stderr
    assert "sbatch is not installed here: copy it" in " ".join(result.stderr.split())
    [script] = (no_sbatch / "outputs" / "audit" / "slurm").glob("*.sbatch")
    text = script.read_text()
    assert all(f"#SBATCH {entry}\n" in text for entry in extra), text


@pytest.mark.parametrize(
    ("slurm", "expected", "fix"),
    [
        ({"extra_sbatch": ["--nodes=many"]}, "slurm.extra_sbatch[0] sets --nodes, which the job script already "
         "writes from slurm.nodes", "set slurm.nodes instead"),
        ({"extra_sbatch": ["--time=1-00:00:00"]}, "sets --time, which the job script already writes from slurm.time",
         "set slurm.time instead"),
        ({"extra_sbatch": ["-o x.log"]}, "sets -o, which the job script already writes", "remove it"),
        ({"partition": "gpu", "extra_sbatch": ["-p debug"]}, "sets -p, which the job script already writes from "
         "slurm.partition", "set slurm.partition instead"),
        ({"extra_sbatch": ["--cpus-per-task=x"]}, "slurm.extra_sbatch[0] --cpus-per-task is 'x': expected a whole "
         "number", "e.g. --cpus-per-task=8"),
        ({"extra_sbatch": ["--gpus-per-node=lots"]}, "--gpus-per-node is 'lots': expected a number of GPUs",
         "e.g. --gpus-per-node=4"),
    ],
)  # fmt: skip
def test_extra_sbatch_options_the_script_writes_or_counts_that_are_not_numbers_are_refused(no_sbatch, slurm, expected,
                                                                                           fix):  # fmt: skip
    """The script writes --nodes, --time, the log ... from the slurm: keys: the same option in extra_sbatch would
    override them without a word (sbatch takes the last) - `--nodes=many` sat under the script's `--nodes=1`."""
    result = invoke("validate", str(write_config(no_sbatch, {**QUICK, "slurm": slurm})), cwd=no_sbatch)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and expected in said and f"fix: {fix}" in said, said
