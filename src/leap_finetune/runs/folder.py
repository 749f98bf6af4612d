"""Every entry of a run folder (outputs/PROJECT/RUN/), named once.

RUN/
  config.yaml            the config as written (+ the command line's --set lines as comments)
  resolved_config.yaml   everything the run decided (profiles merged, paths absolute): what marks a run folder
  prepared/              the validated, tokenized rows (train/, eval/, samples.json, fingerprint.json; with
                         dataset.hold_out_tools, unseen_tools.jsonl: the held-out rows as a benchmark)
  dropped_rows.jsonl     rows left out (on_invalid: skip), with why
  train.log              everything printed
  metrics.jsonl          one JSON line per log / evaluation step
  completions.jsonl      GRPO: a few completions per log step with their rewards
  resume_changes.json    config changes accepted on resume (resume_allow_changes)
  checkpoint-N/          checkpoints (complete when their marker is written)
  benchmarks/            benchmark results, predictions, async snapshots and jobs
  servers/               the logs of servers the driver started
  plots/                 loss and metric plots
  model/, adapter/       the trained model (and a LoRA run's adapter)
  summary.json           written last, when the run ends
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_COPY = "config.yaml"
RESOLVED_CONFIG = "resolved_config.yaml"
PREPARED = "prepared"
UNSEEN_TOOLS = "unseen_tools.jsonl"  # in prepared/
SAMPLES = "samples.json"  # in prepared/: the prompts of the sample answers printed before and after training
FINGERPRINT = "fingerprint.json"  # in prepared/: what the prepared rows were made from (a resume compares it)
PREPARED_SPLITS = ("train", "eval")  # in prepared/: the rows of each split as a datasets folder
DROPPED_ROWS = "dropped_rows.jsonl"
TRAIN_LOG = "train.log"
METRICS = "metrics.jsonl"
COMPLETIONS = "completions.jsonl"
RESUME_CHANGES = "resume_changes.json"
CHECKPOINT_PREFIX = "checkpoint-"
BENCHMARKS = "benchmarks"
BENCHMARK_RESULTS = "results"  # in benchmarks/: step-N.json, the scores of each evaluation
SNAPSHOTS = "snapshots"  # in benchmarks/: async evaluation's hand-over (evaluation/handoff.py)
EVAL_JOBS = "jobs"  # in benchmarks/: async evaluation's sbatch scripts and logs
SERVERS = "servers"
PLOTS = "plots"
MODEL = "model"
ADAPTER = "adapter"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class RunFolder:
    """A run folder's entries as paths: `RunFolder(run_dir).metrics`."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config_copy(self) -> Path:
        return self.path / CONFIG_COPY

    @property
    def resolved_config(self) -> Path:
        return self.path / RESOLVED_CONFIG

    @property
    def prepared(self) -> Path:
        return self.path / PREPARED

    @property
    def unseen_tools(self) -> Path:
        return self.path / PREPARED / UNSEEN_TOOLS

    @property
    def samples(self) -> Path:
        return self.path / PREPARED / SAMPLES

    @property
    def fingerprint(self) -> Path:
        return self.path / PREPARED / FINGERPRINT

    def prepared_split(self, split: str) -> Path:
        """prepared/train or prepared/eval: a split's tokenized rows (datasets' save_to_disk)."""
        assert split in PREPARED_SPLITS, split
        return self.path / PREPARED / split

    @property
    def dropped_rows(self) -> Path:
        return self.path / DROPPED_ROWS

    @property
    def train_log(self) -> Path:
        return self.path / TRAIN_LOG

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def completions(self) -> Path:
        return self.path / COMPLETIONS

    @property
    def resume_changes(self) -> Path:
        return self.path / RESUME_CHANGES

    @property
    def benchmarks(self) -> Path:
        return self.path / BENCHMARKS

    @property
    def snapshots(self) -> Path:
        """Asynchronous evaluation: the snapshots rank 0 hands to the driver (evaluation/handoff.py)."""
        return self.path / BENCHMARKS / SNAPSHOTS

    @property
    def eval_jobs(self) -> Path:
        """Asynchronous evaluation: the sbatch scripts, job and server logs."""
        return self.path / BENCHMARKS / EVAL_JOBS

    @property
    def benchmark_results(self) -> Path:
        """benchmarks/results/step-N.json: the scores of the evaluation of training step N, whichever mode ran it."""
        return self.path / BENCHMARKS / BENCHMARK_RESULTS

    @property
    def servers(self) -> Path:
        return self.path / SERVERS

    @property
    def plots(self) -> Path:
        return self.path / PLOTS

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def adapter(self) -> Path:
        return self.path / ADAPTER

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    def checkpoint(self, step: int) -> Path:
        return self.path / f"{CHECKPOINT_PREFIX}{step}"

    def is_run(self) -> bool:
        """A run folder is one with a resolved config (written before anything else is)."""
        return self.resolved_config.exists()
