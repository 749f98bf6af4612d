"""`export RUN --gguf TYPE --checkpoints`: every intact checkpoint of a run (and its final model) exported, scored
on the run's benchmarks and timed on this CPU like one export, side by side - which step to ship, in which quant.

Each checkpoint gets its own export folder (`checkpoint-N/`, `final/`: the files, quantization.json, the card), the
whole written in a staging folder and put in place only when every export succeeded; `checkpoints.json` and
`checkpoints.png` (each file's mean benchmark score against the step, and against its generation speed) beside
them.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError


def sources(run: Path) -> list[tuple[str, Path]]:
    """(name, folder) of each intact checkpoint, oldest first, then the final model."""
    from leap_finetune.runs.checkpoints import checkpoints, verify
    from leap_finetune.runs.folder import RunFolder

    found = [(c.name, c) for c in checkpoints(run) if verify(c).ok]
    if RunFolder(run).model.is_dir():
        found.append(("final", run))
    if len(found) < 2:
        raise LeapError(
            f"--checkpoints compares a run's checkpoints, and {run} has {len(found)} to export",
            where=str(run),
            fix="give a run folder that saved checkpoints (save_steps), or export without --checkpoints",
        )
    return found


def export_all(run: Path, types: list[str], output: Path | None, console: Console, **options) -> Path:
    from leap_finetune.gguf_export.export import _output_folder, export_gguf
    from leap_finetune.runs.atomic import replace_folder

    run = run.expanduser().resolve()
    if not run.is_dir():
        raise LeapError("--checkpoints takes a run folder", where=str(run), fix="give outputs/PROJECT/RUN")
    found = sources(run)
    output = _output_folder(output or run / "export-gguf-checkpoints", str(run))

    def write(staging: Path) -> None:
        staging.mkdir(parents=True)
        rows = []
        for name, folder in found:
            console.print(f"--- {name}", markup=False)
            export_gguf(str(folder), types, output=staging / name, console=console, **options)
            rows.append(_row(name, staging / name))
        (staging / "checkpoints.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        _plot(staging, rows)
        _print(rows, console)

    replace_folder(output, write)
    console.print(f"exported {len(found)} models to {output} (checkpoints.json, checkpoints.png)", markup=False)
    return output


def _row(name: str, folder: Path) -> dict:
    """What one export measured: per file, its mean benchmark score and generation speed."""
    record = json.loads((folder / "quantization.json").read_text(encoding="utf-8"))
    scores: dict[str, list[float]] = {}
    for bench in record["verification"].get("benchmarks", []):
        for gguf_type, found in bench["gguf"].items():
            scores.setdefault(gguf_type, []).append(found["score"])
    speed = (record.get("device") or {}).get("files") or {}
    files = {}
    for gguf_type, file_name in record["files"].items():
        values = scores.get(gguf_type)
        files[gguf_type] = {
            "file": f"{name}/{file_name}",
            "mean_score": round(sum(values) / len(values), 4) if values else None,
            "generation_tokens_per_s": (speed.get(gguf_type) or {}).get("generation_tokens_per_s"),
        }
    step = int(name.rsplit("-", 1)[-1]) if name.startswith("checkpoint-") else None
    return {"model": name, "step": step, "files": files}


def _print(rows: list[dict], console: Console) -> None:
    from rich.table import Table

    table = Table(title="Each checkpoint's files: mean benchmark score (generation tokens/s on this CPU)")
    table.add_column("model")
    types = list(dict.fromkeys(t for r in rows for t in r["files"]))
    for gguf_type in types:
        table.add_column(gguf_type, justify="right")
    for row in rows:
        cells = []
        for gguf_type in types:
            found = row["files"].get(gguf_type) or {}
            score, speed = found.get("mean_score"), found.get("generation_tokens_per_s")
            cells.append(("-" if score is None else f"{score:.4f}") + (f" ({speed:,.0f}/s)" if speed else ""))
        table.add_row(row["model"], *cells)
    console.print(table)


def _plot(folder: Path, rows: list[dict]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    by_step, by_speed = fig.subplots(1, 2)
    last = max((r["step"] or 0 for r in rows), default=0)
    for gguf_type in dict.fromkeys(t for r in rows for t in r["files"]):
        points = [((r["step"] if r["step"] is not None else last + 1), r["files"][gguf_type]) for r in rows
                  if gguf_type in r["files"] and r["files"][gguf_type]["mean_score"] is not None]  # fmt: skip
        if not points:
            continue
        by_step.plot([s for s, _ in points], [f["mean_score"] for _, f in points], marker="o", label=gguf_type)
        timed = [f for _, f in points if f["generation_tokens_per_s"]]
        if timed:
            by_speed.scatter([f["generation_tokens_per_s"] for f in timed], [f["mean_score"] for f in timed],
                             label=gguf_type)  # fmt: skip
    by_step.set_xlabel("step (the last point: the final model)")
    by_speed.set_xlabel("generation tokens/s on this CPU")
    for axis in (by_step, by_speed):
        axis.set_ylabel("mean benchmark score")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # (no speed measured: nothing to label)
            axis.legend(fontsize=8)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.95, wspace=0.25)
    fig.savefig(folder / "checkpoints.png", format="png", dpi=100)
