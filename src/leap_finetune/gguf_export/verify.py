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
    drift: dict[str, dict[str, float]] = field(default_factory=dict)  # GGUF type -> kl, top1 (gguf_export/drift.py)

    def loss(self, model: str, benchmark: str) -> float:
        """Points lost by quantization: the original's score minus the GGUF file's (negative: it scored higher)."""
        return self.scores[ORIGINAL][benchmark] - self.scores[model][benchmark]

    def cell(self, model: str, benchmark: str) -> str:
        """`0.8750 (-0.1250)`: the file's score and its change from the original."""
        if model == ORIGINAL:
            return f"{self.scores[model][benchmark]:.4f}"
        change = self.scores[model][benchmark] - self.scores[ORIGINAL][benchmark] + 0.0  # (no -0.0000)
        return f"{self.scores[model][benchmark]:.4f} ({'±0' if change == 0 else f'{change:+.4f}'})"

    def drift_cells(self, model: str) -> tuple[str, str]:
        if model == ORIGINAL:
            return "0", "1.000"
        found = self.drift.get(model)
        return (f"{found['kl']:.2e}", f"{found['top1']:.3f}") if found else ("-", "-")

    def as_json(self) -> dict:
        models = [m for m in self.scores if m != ORIGINAL]
        return {
            "how": "leap-finetune eval on the run's benchmarks: the original transformers model, then each GGUF "
            "file read back dequantised by transformers (gguf_file)",
            "skipped": self.skipped,
            "not_measured": self.unread,
            "drift": {
                "how": "over the benchmark rows' answers: mean KL(original || file) of the next-token distributions "
                "(nats per token) and the share of positions where the most likely token is the same",
                **self.drift,
            },
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
    """The run's resolved config with its benchmarks (every row validated now, before any file is written), or
    (None, why there is nothing to measure)."""
    if not run_config:
        return None, "the model does not come from a run folder (no resolved_config.yaml beside it): no benchmarks"
    from pydantic import ValidationError

    from leap_finetune.config.resolved import ResolvedConfig
    from leap_finetune.runs.folder import RESOLVED_CONFIG

    try:
        resolved = ResolvedConfig.model_validate(run_config)
    except ValidationError as err:
        raise LeapError(
            f"the run's resolved_config.yaml does not read as this release's config ({err.errors()[0]['msg']}: "
            f"{'.'.join(str(p) for p in err.errors()[0]['loc'])}); its benchmarks cannot be run",
            where=RESOLVED_CONFIG,
            fix="export with --no-verify, then run leap-finetune eval with a current config on the files",
        ) from None
    if resolved.evals is None or not resolved.evals.benchmarks:
        return None, "the run has no benchmarks (evals.benchmarks)"
    from leap_finetune.evaluation.runner import has_images, load_benchmarks

    loaded = load_benchmarks(
        resolved.evals, vision=True, model_name=resolved.model_name, environment=resolved.environment
    )
    images = [b.name for b in loaded if has_images([b])]
    if images:
        return None, (
            f"image benchmarks ({', '.join(images)}) need the vision encoder, which llama.cpp keeps in the mmproj "
            "file; transformers reads only the language model of a GGUF file: serve both with llama-server and run "
            "leap-finetune eval --server"
        )
    return resolved, None


def verify(resolved, why_not: str | None, original: Path, files: dict[str, Path], console: Console) -> Verification:
    """The run's benchmarks (`benchmarks_of`) on `original` and on each of `files` (type -> GGUF file)."""
    if resolved is None:
        return Verification([], skipped=why_not)
    from leap_finetune.evaluation.standalone import evaluate_config
    from leap_finetune.models.gguf import GgufUnreadable

    names = [(b.name, b.metric) for b in resolved.evals.benchmarks]
    result = Verification(names)
    quiet = Console(file=io.StringIO())  # (each evaluation's own table: ours compares them)
    for label, path in [(ORIGINAL, original), *files.items()]:
        console.print(f"verifying: the run's benchmarks on {label}", markup=False)
        checked = resolved.model_copy(update={"checkpoint": str(path)})
        try:  # (float32, not re-quantized: the original as the GGUF files are read)
            report = evaluate_config(checked, console=quiet, float32=True)
        except GgufUnreadable as err:
            # a block type transformers' loader lacks: llama.cpp itself can still be asked, through its server
            result.unread[label] = err.message.split(": ", 1)[-1]
            continue
        result.scores[label] = {name: report["results"][f"benchmark/{name}/score"] for name, _ in names}
    from leap_finetune.gguf_export.drift import drift

    console.print("measuring how far each file's next-token predictions moved from the original's", markup=False)
    result.drift = drift(resolved, original, files, set(result.scores) - {ORIGINAL})
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
    table.add_column("KL from original\n(nats/token)", justify="right")
    table.add_column("same top-1\ntoken", justify="right")
    for model in verification.scores:
        table.add_row(
            model,
            *(verification.cell(model, name) for name, _ in verification.benchmarks),
            *verification.drift_cells(model),
        )
    console.print(table)
    for model, why in verification.unread.items():
        console.print(f"{model}: not measured here ({why}); {SERVER_HINT}", markup=False)
