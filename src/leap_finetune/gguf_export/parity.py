"""Serving parity: does the runtime render a prompt exactly as training did? Each benchmark row's conversation
(with its tools) is rendered by llama-server from the chat template inside the exported file (its
`/apply-template` endpoint, the text it would feed the model) and compared byte for byte with leap-finetune's own
rendering (data/render.py, the template the run trained with). A runtime that renders differently - a tool
definition gaining `"description": ""`, a missing newline, another system prompt - serves a prompt the model never
saw in training; the export shows the first difference of each such row, in its report, quantization.json
(`serving_parity`) and the card.

Checked where llama-server is found (beside llama-quantize, or on PATH), on one file (every file of an export
holds the same template).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from rich.console import Console

CONTEXT = 24  # characters shown on each side of a difference
SHOWN = 5  # rows with a difference listed


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 30) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def _start(program: Path, gguf: Path, log: Path, timeout: float = 120, extra: list[str] | None = None):
    """(the server, its port, the log's handle) once it answers /health; (None, None, handle) when it does not."""
    port = _free_port()
    handle = log.open("w")
    server = subprocess.Popen(
        [str(program), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "--jinja",
         "-np", "1", "--no-warmup", *(extra or [])],
        stdout=subprocess.DEVNULL,
        stderr=handle,  # (a file: a pipe nobody reads could fill and stall the server)
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server, port, handle
        except OSError:
            time.sleep(0.3)
    server.kill()
    server.wait()
    return None, None, handle


def first_difference(ours: str, theirs: str) -> dict | None:
    """Where two renderings part: the character index and the text around it on each side; None when equal."""
    if ours == theirs:
        return None
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    start = max(0, at - CONTEXT)
    return {"at": at, "ours": ours[start : at + CONTEXT], "server": theirs[start : at + CONTEXT]}


def check(program: Path | None, gguf: Path, items: list[tuple[str, list, list | None]], renderer, why_not=None):
    """items: (benchmark name, prompt messages, tools). {"server", "rows", "same", "differ": [...]} or
    {"skipped": why}."""
    if program is None:
        return {"skipped": why_not}
    if not items:
        return {"skipped": "the run has no benchmark rows to render"}
    log = gguf.parent / ".parity-server.log"
    server, port, handle = _start(program, gguf, log)
    if server is None:
        handle.close()
        tail = log.read_text(errors="replace")[-300:] if log.exists() else ""
        log.unlink(missing_ok=True)
        return {"skipped": f"llama-server did not start: {tail.strip().splitlines()[-1] if tail.strip() else '?'}"}
    differ, same = [], 0
    try:
        for index, (name, messages, tools) in enumerate(items):
            body = {"messages": messages, **({"tools": tools} if tools else {})}
            try:
                theirs = _post(f"http://127.0.0.1:{port}/apply-template", body)["prompt"]
            except (OSError, ValueError, KeyError) as err:  # (an older llama-server lacks the endpoint: 404)
                return {"skipped": f"llama-server's /apply-template did not answer ({type(err).__name__}: {err})"}
            found = first_difference(renderer.prompt_text(messages, tools), theirs)
            if found is None:
                same += 1
            else:
                differ.append({"benchmark": name, "row": index, **found})
    finally:
        _stop(server)
        handle.close()
        log.unlink(missing_ok=True)
    return {"server": "llama-server /apply-template", "rows": len(items), "same": same, "differ": differ}


def _stop(server) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def print_parity(parity: dict, console: Console) -> None:
    if "skipped" in parity:
        console.print(f"serving parity: not checked ({parity['skipped']})", markup=False)
        return
    if not parity["differ"]:
        console.print(
            f"serving parity: llama-server renders all {parity['rows']} benchmark prompts exactly as training did",
            markup=False,
        )
        return
    console.print(
        f"serving parity: llama-server renders {len(parity['differ'])} of {parity['rows']} benchmark prompts "
        "differently from training - the model would be served prompts it never trained on:",
        markup=False,
    )
    for row in parity["differ"][:SHOWN]:
        console.print(
            f"  {row['benchmark']} row {row['row']}, character {row['at']}: training {row['ours']!r}, "
            f"llama-server {row['server']!r}",
            markup=False,
        )


def parity_lines(parity: dict) -> list[str]:
    lines = ["## Serving parity", ""]
    if "skipped" in parity:
        return lines + [f"Not checked: {parity['skipped']}."]
    if not parity["differ"]:
        return lines + [
            f"llama-server (the chat template inside the file, `--jinja`) renders all {parity['rows']} benchmark "
            "prompts byte for byte as the run trained on them."
        ]
    lines += [
        f"llama-server renders {len(parity['differ'])} of {parity['rows']} benchmark prompts differently from "
        "training (the first difference of each):",
        "",
        "| benchmark | row | character | training | llama-server |",
        "|---|---|---|---|---|",
    ]
    for row in parity["differ"][:SHOWN]:
        lines.append(f"| {row['benchmark']} | {row['row']} | {row['at']} | `{row['ours']!r}` | `{row['server']!r}` |")
    return lines


def benchmark_items(resolved) -> list[tuple[str, list, list | None]]:
    """Every benchmark row's prompt (generation and multiple-choice alike) with its tools."""
    from leap_finetune.evaluation.runner import load_benchmarks

    loaded = load_benchmarks(resolved.evals, vision=False, model_name=resolved.model_name)
    return [(bench.name, item.prompt, item.tools) for bench in loaded for item in bench.items]


def renderer_for(model_dir: Path, resolved):
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.data.render import Renderer
    from leap_finetune.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir), {})
    return Renderer(tokenizer, load_chat_template(resolved.chat_template, tokenizer), "all", None)
