"""Which vLLM tool parser reads LFM2 / LFM2.5 tool calls (issue #29): a model trained by examples/tools_benchmark.yaml
served by `vllm serve` with each parser, scored by `leap-finetune eval --server` on the example's benchmarks (the
rows' `tools` sent as OpenAI tools, the server's returned `tool_calls` scored), beside the same model evaluated
in-process (transformers) as the reference.

python bench/vllm_tool_parsers.py --run RUN_DIR --out DIR [--parsers lfm2,pythonic,hermes,none] [--smoke]
                                  [--llama-cpp DIR]

Per parser: the server's start-up, how many answers came back as tool_calls, how many kept the calls in their
text, server errors, and the exact-call accuracy / name accuracy against the in-process reference. Rows go to
DIR/rows.jsonl, the table to DIR/table.md and stdout; each server's log end to DIR/logs.txt.

Every process started here gets VLLM_HOST_IP=127.0.0.1 (vLLM's rendezvous hangs on the machine's unresolvable
hostname), VLLM_ENABLE_V1_MULTIPROCESSING=0 and NVLink multicast off.
--smoke: on a CPU, `transformers serve` instead of vLLM (parsers: `transformers`). --llama-cpp DIR (a llama.cpp
build, scripts/build_llama_cpp.sh): also llama.cpp's `llama-server --jinja` on the run exported to an f16 GGUF.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from leap_finetune.runs.processes import NO_MULTICAST  # noqa: E402 - NVLink multicast off

VLLM_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CONFIG = ROOT / "examples" / "tools_benchmark.yaml"
LLAMA_SERVER = Path("llama-server")  # --llama-cpp DIR: DIR/build/bin/llama-server
KEYS = ("server_tool_calls", "calls_in_text", "server_errors", "exact", "name", "argument_f1", "rows")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, limit_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return time.monotonic() - started
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"the server did not answer in {limit_s:.0f} s")


def server_command(parser: str, model: Path, port: int) -> list[str]:
    if parser == "llama.cpp":  # model: a GGUF file
        return [str(LLAMA_SERVER), "-m", str(model), "--jinja", "--host", "127.0.0.1", "--port", str(port)]
    if parser == "transformers":
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model), "--host", "127.0.0.1",
                "--port", str(port), "--device", "cpu"]  # fmt: skip
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
               "127.0.0.1", "--port", str(port), "--enforce-eager", "--gpu-memory-utilization", "0.2",
               "--max-model-len", "2048"]  # fmt: skip
    if parser != "none":
        command += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    return command


def evaluate(run: Path, out: Path, server: str | None) -> dict:
    from leap_finetune.evaluation.standalone import evaluate_config
    from leap_finetune.validate.loader import load_config

    resolved = load_config(CONFIG, overrides=[f"checkpoint={run.resolve()}"])
    return evaluate_config(resolved, output=out, server=server)["results"]


def row(parser: str, results: dict, startup: float | None) -> dict:
    found = {"parser": parser, "startup_s": round(startup, 1) if startup is not None else None}
    for bench in ("tool_calls", "unseen_tools"):
        for key in KEYS:
            value = results.get(f"benchmark/{bench}/{key}")
            if value is not None:
                found[f"{bench}/{key}"] = value
    return found


def table(rows: list[dict]) -> str:
    lines = [
        "| parser | start-up s | tool_calls returned | calls left in text | server errors | exact | name | "
        "unseen_tools exact | unseen name |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['parser']} | failed: {r['error'][:120]} |  |  |  |  |  |  |  |")
            continue

        def cell(key: str) -> str:
            value = r.get(key)
            return "-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))

        lines.append(
            f"| {r['parser']} | {cell('startup_s')} | {cell('tool_calls/server_tool_calls')} / "
            f"{cell('tool_calls/rows')} | {cell('tool_calls/calls_in_text')} | {cell('tool_calls/server_errors')} | "
            f"{cell('tool_calls/exact')} | {cell('tool_calls/name')} | {cell('unseen_tools/exact')} | "
            f"{cell('unseen_tools/name')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--run", type=Path, required=True, help="a finished run folder of examples/tools_benchmark.yaml"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parsers", default="lfm2,pythonic,hermes,none")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--llama-cpp", type=Path, help="a llama.cpp build: adds llama-server --jinja on an f16 GGUF")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update({**VLLM_ENV, **NO_MULTICAST})
    parsers = ["transformers"] if args.smoke else args.parsers.split(",")
    gguf = None
    if args.llama_cpp:
        global LLAMA_SERVER
        LLAMA_SERVER = args.llama_cpp / "build" / "bin" / "llama-server"
        gguf = export_gguf(args.run, args.out / "gguf")
        parsers = [p for p in parsers if p != "transformers"] + ["llama.cpp"]
    rows = [row("in-process (transformers)", evaluate(args.run, args.out / "local.json", None), None)]
    for name in parsers:
        port = free_port()
        log = args.out / f"server-{name}.log"
        with log.open("w") as handle:
            process = subprocess.Popen(
                server_command(name, gguf if name == "llama.cpp" else args.run / "model", port),
                stdout=handle,
                stderr=subprocess.STDOUT,
                env={**os.environ, **VLLM_ENV, **NO_MULTICAST},
            )
        url = f"http://127.0.0.1:{port}/v1"
        try:
            startup = wait_for(url, process, 300)
            rows.append(row(name, evaluate(args.run, args.out / f"{name}.json", url), startup))
        except Exception as err:  # noqa: BLE001 - a failed parser is a row of the table
            rows.append({"parser": name, "error": f"{type(err).__name__}: {err}".splitlines()[0]})
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        with (args.out / "logs.txt").open("a") as handle:
            handle.write(f"==== {name}\n" + "".join(log.read_text(errors="replace").splitlines(True)[-40:]))
        with (args.out / "rows.jsonl").open("a") as handle:
            handle.write(json.dumps(rows[-1]) + "\n")
    versions = {p: _version(p) for p in ("vllm", "transformers", "torch")}
    text = (
        f"{datetime.date.today()} {'smoke (CPU)' if args.smoke else 'GPU'}; {versions}; run {args.run.name}\n\n"
        + table(rows)
    )
    (args.out / "table.md").write_text(text + "\n")
    print(text)


def export_gguf(run: Path, out: Path) -> Path:
    """The run's model as an f16 GGUF file (leap-finetune export --gguf f16, not verified: the table scores it)."""
    if not out.exists():
        code = "import sys; from leap_finetune.cli import app; sys.argv[0] = 'leap-finetune'; app()"
        command = [sys.executable, "-c", code, "export", str(run), "--gguf", "f16", "--no-verify", "-o", str(out)]
        subprocess.run(
            command,
            check=True,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
            },
        )
    return next(out.glob("*.gguf"))


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


if __name__ == "__main__":
    main()
