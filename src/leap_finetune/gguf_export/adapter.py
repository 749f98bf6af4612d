"""`export RUN --gguf TYPE --gguf-adapter`: a LoRA run shipped as the base model in TYPE plus its adapter as a GGUF
file of its own (f16), for `llama-server -m BASE.gguf --lora ADAPTER.gguf` - one base on the device, several small
adapters beside it.

The adapter goes through llama.cpp's own LoRA converter (convert_lora_to_gguf.py, in the llama.cpp source folder
scripts/build_llama_cpp.sh makes: the PyPI converter package does not carry it). It is verified as the merged file
would be: the run's benchmarks on the merged transformers model, and the generation benchmarks answered by
llama-server running the base file with the adapter (log-prob benchmarks need the model's own log-probs: they stay
with the merged model), side by side.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError

SCRIPT = "convert_lora_to_gguf.py"


def find_adapter(trained, source: str):
    """The adapter of a LoRA run (the run folder's adapter/, or an adapter folder given), with its base."""
    from leap_finetune.models.trained import trained_in
    from leap_finetune.runs.folder import RunFolder

    if trained.adapter_dir is not None:
        return trained
    folder = RunFolder(Path(source)).adapter
    found = trained_in(folder) if folder.is_dir() else None
    if found is None or found.adapter_dir is None:
        raise LeapError(
            "--gguf-adapter writes a LoRA adapter, and there is none here",
            where=source,
            fix="give a LoRA run's folder (or its adapter/); a full fine-tune exports with --gguf alone",
        )
    return found


def find_converter(llama_cpp) -> Path:
    """llama.cpp's convert_lora_to_gguf.py: in the --llama-cpp folder or a folder above its programs, else beside
    the llama-quantize on PATH."""
    from leap_finetune.gguf_export.llama_cpp import BUILD_HINT

    starts = [Path(llama_cpp).expanduser()] if llama_cpp is not None else []
    on_path = shutil.which("llama-quantize")
    if on_path:
        starts.append(Path(on_path).resolve().parent)
    for start in starts:
        for folder in (start, *list(start.parents)[:3]):
            if (folder / SCRIPT).is_file():
                return folder / SCRIPT
    raise LeapError(
        f"--gguf-adapter needs llama.cpp's {SCRIPT}, found in its source folder",
        where="--llama-cpp" if llama_cpp is not None else "export",
        fix=f"give --llama-cpp the llama.cpp folder that holds {SCRIPT} and build/; " + BUILD_HINT,
    )


def convert_adapter(script: Path, base_dir: Path, adapter_dir: Path, target: Path) -> Path:
    """The adapter as an f16 GGUF file (llama.cpp's converter reads the base's config for the architecture)."""
    root = script.parent
    base_dir, adapter_dir, target = base_dir.resolve(), adapter_dir.resolve(), target.resolve()  # (run from root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "gguf-py"), str(root)])}
    command = [sys.executable, str(script), "--base", str(base_dir), "--outtype", "f16", "--outfile", str(target),
               str(adapter_dir)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, check=False)
    if result.returncode != 0 or not target.is_file():
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-6:])
        raise LeapError(
            f"llama.cpp's LoRA converter could not write the adapter (exit {result.returncode}):\n{tail}",
            where=str(script),
            fix="see its message above; the converter comes with the llama.cpp source it was built from",
        )
    return target


def verify(server: Path | None, base_file: Path, adapter_file: Path, measured: tuple, merged: Path, console) -> dict:
    """The merged model's benchmark scores beside those of llama-server running the base with the adapter."""
    resolved, why_not = measured
    if resolved is None:
        return {"skipped": why_not}
    if server is None:
        return {"skipped": "llama-server not found: the base with its adapter could not be served"}
    from leap_finetune.evaluation.standalone import evaluate_config
    from leap_finetune.gguf_export.parity import _start, _stop

    quiet = Console(file=io.StringIO())
    checked = resolved.model_copy(update={"checkpoint": str(merged)})
    console.print("verifying: the run's benchmarks on the merged model", markup=False)
    original = evaluate_config(checked, console=quiet, float32=True)["results"]
    log = base_file.parent / ".adapter-server.log"
    process, port, handle = _start(server, base_file, log, extra=["--lora", str(adapter_file)])
    try:
        if process is None:
            return {"skipped": "llama-server did not start with the adapter (its log: see --debug)"}
        console.print("verifying: the generation benchmarks through llama-server (base + adapter)", markup=False)
        served = evaluate_config(checked, console=quiet, server=f"http://127.0.0.1:{port}/v1")["results"]
    finally:
        if process is not None:
            _stop(process)
        handle.close()
        log.unlink(missing_ok=True)
    generation = [b.name for b in resolved.evals.benchmarks if not b.metric.startswith("logprob")]
    return {
        "how": "the merged transformers model against llama-server -m BASE --lora ADAPTER (generation benchmarks; "
        "log-prob ones need the model's own log-probs)",
        "benchmarks": {
            name: {"merged": original[f"benchmark/{name}/score"], "base_and_adapter": served[f"benchmark/{name}/score"]}
            for name in generation
        },
    }


def print_verification(found: dict, console: Console) -> None:
    if "skipped" in found:
        console.print(f"adapter: not verified ({found['skipped']})", markup=False)
        return
    for name, scores in found["benchmarks"].items():
        console.print(
            f"adapter: {name}: merged model {scores['merged']:.4f}, llama-server base + adapter "
            f"{scores['base_and_adapter']:.4f}",
            markup=False,
        )


def card_lines(adapter_file: Path, base_file: Path, found: dict) -> list[str]:
    lines = [
        "## LoRA adapter",
        "",
        f"`{adapter_file.name}` is the run's LoRA adapter (f16) for the base model file `{base_file.name}`:",
        "",
        "```bash",
        f"llama-server -m {base_file.name} --lora {adapter_file.name} --port 8080 --jinja",
        "```",
        "",
    ]
    if "skipped" in found:
        return lines + [f"Not verified: {found['skipped']}."]
    lines += ["| benchmark | merged model | llama-server, base + adapter |", "|---|---|---|"]
    for name, scores in found["benchmarks"].items():
        lines.append(f"| {name} | {scores['merged']:.4f} | {scores['base_and_adapter']:.4f} |")
    return lines
