"""How fast each exported file runs on this machine's CPU: llama.cpp's own `llama-bench` (prompt processing and
generation tokens/s, the defaults of a phone or laptop run: all cores, no GPU), and the peak resident memory of the
process that ran it (the kernel's count for that process alone: os.wait4). Written into the export's table,
quantization.json (`device`) and the card, with a plot of benchmark score against speed and size over the files.

Measured only where llama-bench is found (built by scripts/build_llama_cpp.sh); otherwise the export says so and
goes on. A file llama-bench cannot run is a row that says why, never a failed export.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

from rich.console import Console

PROMPT_TOKENS, GENERATED_TOKENS, REPEATS = 128, 32, 3


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench_file(program: Path, path: Path, timeout: float = 600) -> dict:
    """One file: {prompt_tokens_per_s, generation_tokens_per_s, peak_rss_mib, threads} or {error}."""
    # (-ngl 0: the CPU only - a CUDA or Metal build would otherwise offload every layer to its GPU by default)
    command = [str(program), "-m", str(path), "-p", str(PROMPT_TOKENS), "-n", str(GENERATED_TOKENS),
               "-r", str(REPEATS), "-ngl", "0", "-o", "json"]  # fmt: skip
    log = path.parent / f".{path.name}.bench.json"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.DEVNULL, env={**os.environ, "LLAMA_LOG_COLORS": "0"}
        )
        try:
            peak = _watch(process, timeout)
        finally:  # (Ctrl-C or an error here: llama-bench does not run on past the export)
            if process.poll() is None:
                process.kill()
                process.wait()
    code = process.returncode
    try:
        rows = json.loads(log.read_text())
    except (OSError, json.JSONDecodeError):
        rows = None
    finally:
        log.unlink(missing_ok=True)
    if code != 0 or not rows:
        return {"error": f"llama-bench exit {code}" + (" (killed after the time limit)" if code < 0 else "")}
    prompt = next((r for r in rows if r.get("n_prompt") and not r.get("n_gen")), {})
    generation = next((r for r in rows if r.get("n_gen") and not r.get("n_prompt")), {})
    return {
        "prompt_tokens_per_s": round(float(prompt.get("avg_ts", 0.0)), 1),
        "generation_tokens_per_s": round(float(generation.get("avg_ts", 0.0)), 1),
        "peak_rss_mib": round(peak / 1024, 1) if peak > 1024 else None,  # (under 1 MiB: the exec, not the run)
        "threads": prompt.get("n_threads") or generation.get("n_threads"),
    }


def _watch(process, timeout: float) -> int:
    """Waits for the process; its peak resident memory in KiB, from the kernel's high-water mark of its own address
    space (/proc/PID/status VmHWM, which starts at the exec: not the fork's copy of this Python process, which the
    exit's rusage would report), read every 10 ms until it exits. A run over before the model loaded into a reading
    (a tiny model) gives 0: said as not measured."""
    import time

    peak, deadline = 0, time.monotonic() + timeout
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            break
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            pass  # (not Linux, or gone between the poll and the read)
        time.sleep(0.01)
    return peak


def measure(program: Path | None, files: dict[str, Path], console: Console, why_not: str | None = None) -> dict:
    """Every file through llama-bench; {"cpu", "how", "files": {type: figures}} or {"skipped": why}."""
    if program is None:
        console.print(f"device speed: not measured ({why_not})", markup=False)
        return {"skipped": why_not}
    found = {}
    for gguf_type, path in files.items():
        console.print(f"measuring {gguf_type} on this CPU (llama-bench) ...", markup=False)
        found[gguf_type] = bench_file(program, path)
    return {
        "cpu": cpu_name(),
        "how": f"llama-bench -p {PROMPT_TOKENS} -n {GENERATED_TOKENS} -r {REPEATS} -ngl 0 (all cores, CPU); peak RSS of its "
        "process",
        "files": found,
    }


def print_speed(speed: dict, console: Console) -> None:
    from rich.table import Table

    if "files" not in speed:
        return
    table = Table(title=f"On this CPU ({speed['cpu']}): llama-bench")
    for column in ("file", "prompt tokens/s", "generation tokens/s", "peak memory"):
        table.add_column(column, justify="left" if column == "file" else "right")
    for gguf_type, figures in speed["files"].items():
        if "error" in figures:
            table.add_row(gguf_type, figures["error"], "", "")
        else:
            table.add_row(
                gguf_type,
                f"{figures['prompt_tokens_per_s']:,.0f}",
                f"{figures['generation_tokens_per_s']:,.0f}",
                f"{figures['peak_rss_mib']:,.0f} MiB" if figures["peak_rss_mib"] is not None else "-",
            )
    console.print(table)


def plot(folder: Path, verification, speed: dict, files: dict[str, Path]) -> Path | None:
    """speed.png: each file's mean benchmark score against its generation tokens/s (the marker's area: its size on
    disk) - the front to pick from. None when either side was not measured."""
    from leap_finetune.gguf_export.verify import ORIGINAL

    measured = speed.get("files") or {}
    points = [
        (t, figures["generation_tokens_per_s"], sum(verification.scores[t].values()) / len(verification.scores[t]),
         files[t].stat().st_size)
        for t, figures in measured.items()
        if "error" not in figures and t in verification.scores and verification.scores[t]
    ]  # fmt: skip
    if not points:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4.2))
    FigureCanvasAgg(fig)
    axis = fig.subplots()
    largest = max(size for *_, size in points)
    for gguf_type, tokens, score, size in points:
        axis.scatter([tokens], [score], s=40 + 400 * size / largest, alpha=0.6)
        axis.annotate(f"{gguf_type} ({size / 2**20:.1f} MiB)", (tokens, score), fontsize=8, xytext=(4, 4),
                      textcoords="offset points")  # fmt: skip
    original = verification.scores.get(ORIGINAL)
    if original:
        axis.axhline(sum(original.values()) / len(original), color="gray", linestyle="--", linewidth=1)
    axis.set_xlabel(f"generation tokens/s on this CPU ({speed['cpu']})")
    axis.set_ylabel("mean benchmark score (dashed: the original)")
    axis.grid(alpha=0.3)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.95)
    path = folder / "speed.png"
    fig.savefig(path, format="png", dpi=100)
    return path
