"""Plots of a run as PNG files in `plots/`, drawn from metrics.jsonl at every checkpoint and at the end (so a
running job can be looked at): loss (train and eval, against steps and against tokens), learning rate,
benchmark scores, a tool_call benchmark's sub-scores (tool_calls_NAME.png), and rewards for DPO / KTO / GRPO.

Each PNG records the series it draws (label -> number of points) in its metadata (`leap-finetune series`):
what the tests read back, and a way to see at a glance what a figure holds. Drawing never stops training: a
failure is reported once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import TrainerCallback

from leap_finetune.files import read_metrics
from leap_finetune.runs.folder import RunFolder


def _series(records: list[dict], key: str) -> tuple[list, list, list]:
    """(steps, tokens seen, values) of `key`; tokens carried from the latest training log."""
    steps, tokens, values, seen = [], [], [], None
    for record in records:
        seen = record.get("num_input_tokens_seen", seen)
        value = record.get(key)
        if isinstance(value, (int, float)):
            steps.append(record["step"])
            tokens.append(seen)
            values.append(value)
    return steps, tokens, values


TOOL_CALL_PARTS = ("exact", "name", "argument_f1", "parsed", "no_call")  # metric tool_call's sub-scores


def _tool_call_benchmarks(keys: list[str]) -> list[str]:
    """Benchmarks of metric tool_call (they log an argument_f1 or a no_call beside the score)."""
    found = [k.split("/")[1] for k in keys if k.startswith("benchmark/") and k.endswith(("/argument_f1", "/no_call"))]
    return list(dict.fromkeys(found))


def _figures(keys: list[str]) -> dict:
    """File name -> (title, [(label, metrics key)], by tokens too) for the keys the run logged."""
    figures = {
        "loss.png": ("loss", [("train loss", "loss"), ("eval loss", "eval_loss")], True),
        "learning_rate.png": ("learning rate", [("learning rate", "learning_rate")], False),
        "benchmarks.png": (
            "benchmark scores",
            [(k.split("/")[1], k) for k in keys if k.startswith("benchmark/") and k.endswith("/score")],
            False,
        ),
        **{
            f"tool_calls_{bench}.png": (
                f"{bench}: tool calls",
                [
                    (part, f"benchmark/{bench}/{part}")
                    for part in TOOL_CALL_PARTS
                    if f"benchmark/{bench}/{part}" in keys
                ],
                False,
            )
            for bench in _tool_call_benchmarks(keys)
        },
        "rewards.png": (
            "rewards",
            [
                (k, k)
                for k in keys
                if k.startswith(("rewards/", "eval_rewards/")) or k in ("reward", "eval_reward", "kl", "eval_kl")
            ],
            False,
        ),
        "experts.png": (  # a mixture of experts' routers (models/moe_router.py)
            "experts: load (1.0 = even) and balance loss",
            [
                (label, key)
                for label, key in (
                    ("least loaded", "moe/expert_load_min"),
                    ("most loaded", "moe/expert_load_max"),
                    ("load entropy", "moe/expert_load_entropy"),
                    ("balance loss", "moe/aux_loss"),
                )
                if key in keys
            ],
            False,
        ),
        "episodes.png": (  # GRPO with an environment (recipes/grpo_episodes.py)
            "episodes: success, turns, calls, failures",
            [
                (key.split("/")[1], key)
                for key in (
                    "episodes/success",
                    "episodes/answered",
                    "episodes/turns",
                    "episodes/calls",
                    "episodes/parse_failures",
                    "episodes/tool_error_rate",
                )
                if key in keys
            ],
            False,
        ),
    }
    return figures


def write_plots(run_dir: Path) -> list[Path]:
    # matplotlib's object API with the Agg canvas (files only, no display, no pyplot state: safe in a thread)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(RunFolder(run_dir).metrics)
    if not records:
        return []
    figures = _figures(list(dict.fromkeys(k for r in records for k in r)))
    folder = RunFolder(run_dir).plots
    folder.mkdir(exist_ok=True)
    written = []
    for name, (title, wanted, by_tokens) in figures.items():
        drawn = {label: _series(records, key) for label, key in wanted}
        drawn = {label: s for label, s in drawn.items() if s[0]}
        if not drawn:
            continue
        with_tokens = by_tokens and any(t is not None for s in drawn.values() for t in s[1])
        fig = Figure(figsize=(11 if with_tokens else 6.5, 4))
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 2 if with_tokens else 1, squeeze=False)
        for label, (steps, tokens, values) in drawn.items():
            marker = "o" if len(values) < 30 else None
            axes[0][0].plot(steps, values, label=label, marker=marker, markersize=3)
            if with_tokens:
                points = [(t, v) for t, v in zip(tokens, values) if t is not None]
                axes[0][1].plot(
                    [t for t, _ in points], [v for _, v in points], label=label, marker=marker, markersize=3
                )
        for index, axis in enumerate(axes[0]):
            axis.set_xlabel("tokens seen" if index else "step")
            axis.set_title(title + (" (by tokens)" if index else ""))
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
        fig.suptitle(run_dir.name, fontsize=9)
        fig.subplots_adjust(left=0.08 if with_tokens else 0.12, right=0.98, bottom=0.13, top=0.86, wspace=0.22)
        path = folder / name
        partial = folder / f".{name}.partial"
        series = {label: len(s[2]) for label, s in drawn.items()}
        fig.savefig(partial, format="png", dpi=100, metadata={"leap-finetune series": json.dumps(series)})
        os.replace(partial, path)  # a reader never sees half a file
        written.append(path)
    return written


def _import_matplotlib() -> None:
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except Exception:  # noqa: BLE001 - the drawing reports it
        pass


class Plots(TrainerCallback):
    """Redraws the plots at checkpoints (at most once every INTERVAL_S: drawing takes ~0.6 s, and a running job
    is looked at in minutes) and once the run's last evaluation is logged, in a thread beside the saving of
    the model (`draw_in_background`, then `wait`). The main process only."""

    INTERVAL_S = 60.0

    def __init__(self, run_dir: Path, console):
        self.run_dir, self.console, self.failed = run_dir, console, False
        self.last = float("-inf")
        self.thread = None

    def _draw(self) -> None:
        try:
            write_plots(self.run_dir)
        except Exception as err:  # noqa: BLE001 - a plot never stops training
            self.failed = True
            self.console.print(
                f"[yellow]note: the plots could not be drawn ({type(err).__name__}: {err}); training goes on[/yellow]"
            )

    def on_train_begin(self, args, state, control, **kwargs):
        import threading
        import time

        self.last = time.monotonic()  # (the first drawing after a minute of training, or at the end)
        if state.is_world_process_zero:  # matplotlib's ~0.7 s of imports while the model trains, not after
            threading.Thread(target=_import_matplotlib, name="leap-finetune plots import", daemon=True).start()

    def on_save(self, args, state, control, **kwargs):
        import time

        if state.is_world_process_zero and not self.failed and time.monotonic() - self.last >= self.INTERVAL_S:
            self.last = time.monotonic()
            self._draw()

    def draw_in_background(self, main_process: bool) -> None:
        """The final drawing (called by the recipe once the last evaluation is logged), beside the saving."""
        import threading

        if main_process and not self.failed:
            self.thread = threading.Thread(target=self._draw, name="leap-finetune plots", daemon=True)
            self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
