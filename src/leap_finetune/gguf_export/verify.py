"""Every export verified on the run's own benchmarks: the original (the transformers model the GGUF files were
converted from) and each GGUF file, through the same `leap-finetune eval` code, so that the quantization loss per
benchmark (original score - GGUF score) is a difference of two numbers computed the same way."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError

ORIGINAL = "original"
SERVER_HINT = (
    "score it through llama.cpp: llama-server -m FILE, then leap-finetune eval --server http://127.0.0.1:8080/v1"
)


@dataclass
class Verification:
    benchmarks: list[tuple[str, str]]  # (name, metric)
    scores: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # model ("original", "q8_0") -> benchmark -> score
    skipped: str | None = None  # why nothing was measured
    unread: dict[str, str] = field(default_factory=dict)  # GGUF type -> why transformers could not score it

    def loss(self, model: str, benchmark: str) -> float:
        """Points lost by quantization: the original's score minus the GGUF file's (negative: it scored higher)."""
        return self.scores[ORIGINAL][benchmark] - self.scores[model][benchmark]

    def cell(self, model: str, benchmark: str) -> str:
        """`0.8750 (-0.1250)`: the file's score and its change from the original."""
        if model == ORIGINAL:
            return f"{self.scores[model][benchmark]:.4f}"
        change = self.scores[model][benchmark] - self.scores[ORIGINAL][benchmark] + 0.0  # (no -0.0000)
        return f"{self.scores[model][benchmark]:.4f} ({'±0' if change == 0 else f'{change:+.4f}'})"

    def as_json(self) -> dict:
        models = [m for m in self.scores if m != ORIGINAL]
        return {
            "how": "leap-finetune eval on the run's benchmarks: the original transformers model, then each GGUF "
            "file read back dequantised by transformers (gguf_file)",
            "skipped": self.skipped,
            "not_measured": self.unread,
            "benchmarks": [
                {
                    "name": name,
                    "metric": metric,
                    "original": self.scores.get(ORIGINAL, {}).get(name),
                    "gguf": {
                        m: {"score": self.scores[m][name], "quantization_loss": self.loss(m, name)} for m in models
                    },
                }
                for name, metric in self.benchmarks
            ],
        }


def benchmarks_of(run_config: dict | None):
    """The run's resolved config with its benchmarks, or (None, why not)."""
    if not run_config:
        return None, "the model does not come from a run folder (no resolved_config.yaml beside it): no benchmarks"
    from leap_finetune.config.resolved import ResolvedConfig

    resolved = ResolvedConfig.model_validate(run_config)
    if resolved.evals is None or not resolved.evals.benchmarks:
        return None, "the run has no benchmarks (evals.benchmarks)"
    from leap_finetune.evaluation.runner import has_images
    from leap_finetune.evaluation.standalone import check_benchmarks

    images = [b.name for b in check_benchmarks(resolved) if has_images([b])]
    if images:
        return None, (
            f"image benchmarks ({', '.join(images)}) need the vision encoder, which llama.cpp keeps in the mmproj "
            "file; transformers reads only the language model of a GGUF file: serve both with llama-server and run "
            "leap-finetune eval --server"
        )
    return resolved, None


def verify(run_config: dict | None, original: Path, files: dict[str, Path], console: Console) -> Verification:
    """The run's benchmarks on `original` and on each of `files` (type -> GGUF file)."""
    resolved, why_not = benchmarks_of(run_config)
    if resolved is None:
        return Verification([], skipped=why_not)
    from leap_finetune.evaluation.standalone import evaluate_config

    names = [(b.name, b.metric) for b in resolved.evals.benchmarks]
    result = Verification(names)
    quiet = Console(file=io.StringIO())  # (each evaluation's own table: ours compares them)
    for label, path in [(ORIGINAL, original), *files.items()]:
        console.print(f"verifying: the run's benchmarks on {label}", markup=False)
        try:
            report = evaluate_config(resolved.model_copy(update={"checkpoint": str(path)}), console=quiet)
        except LeapError as err:
            if label == ORIGINAL or "transformers cannot read" not in err.message:
                raise
            # (llama-quantize falls back to q5_0 / q5_1 for rows that are not a multiple of 256 values, which
            # transformers' dequantiser does not read: llama.cpp itself can still be asked, through its server)
            result.unread[label] = err.message.split(": ", 1)[-1]
            continue
        result.scores[label] = {name: report["results"][f"benchmark/{name}/score"] for name, _ in names}
    return result


def print_table(verification: Verification, console: Console) -> None:
    from rich.table import Table

    if verification.skipped:
        console.print(f"not verified: {verification.skipped}", markup=False)
        return
    table = Table(title="The run's benchmarks on each file (in brackets: the change from the original)")
    table.add_column("model")
    for name, metric in verification.benchmarks:
        table.add_column(f"{name}\n({metric})", justify="right")
    for model in verification.scores:
        table.add_row(model, *(verification.cell(model, name) for name, _ in verification.benchmarks))
    console.print(table)
    for model, why in verification.unread.items():
        console.print(f"{model}: not measured here ({why}); {SERVER_HINT}", markup=False)
