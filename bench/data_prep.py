"""Data preparation at scale: each figure next to its floor, from one run.

    python bench/data_prep.py --rows 20000 --memory-rows 100000

- floor: the fast tokenizer's own batched call (`tokenizer(texts)`, 512 texts a call) on the rendered
  texts, ONE core (TOKENIZERS_PARALLELISM=false);
- ours, one process: read + check every row + render + tokenize + loss masks + Arrow table (`num_proc: 1`);
- ours, every core (`num_proc` = the machine's cores);
- the cache: writing it is part of the preparation; reading it back (what `run` after `validate` does);
- memory: peak RSS of a process that prepares `--memory-rows` rows of ~800 tokens (a fresh process each,
  the workers' peak too), against the same process's RSS once the libraries are imported.
The rows are synthetic multi-turn chats (built-in tiny-lfm2 tokenizer, LFM2 template); `--model` takes a
local model folder for its real tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core for the floor and the one-process figure
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = (
    "the model trains on assistant tokens only while the user asks about data loading speed memory and caches "
    "of prepared rows with tools json arrow numpy and every core"
).split()


def write_rows(path: Path, count: int, words: int = 95) -> None:
    """Chats of 1-3 turns; `words` sets the length (~800 tiny-lfm2 tokens a row at the default)."""
    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice([".", "?", "!"])

    with path.open("w", encoding="utf-8") as handle:
        for _ in range(count):
            messages = [{"role": "system", "content": text(12)}]
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "user", "content": text(rng.randint(words // 4, words // 2))})
                messages.append({"role": "assistant", "content": text(rng.randint(words // 2, words))})
            handle.write(json.dumps({"messages": messages}) + "\n")


def config(path: Path, model: str, processes: int | None, cache: bool) -> dict:
    return {
        "project_name": "bench",
        "model_name": model,
        "training_type": "sft",
        "dataset": {"path": str(path), "test_size": 0.01, "num_proc": processes, "cache": cache},
        "training_config": {"max_length": 4096},
    }


def prepare(cfg: dict):
    from leap_finetune.launch.checks import prepare
    from leap_finetune.validate.loader import load_config

    return prepare(load_config(cfg))


def floor_seconds(cfg: dict) -> tuple[float, float, int]:
    """(tokenizer batched, tokenizer batched with offsets) on the rendered texts, one core; tokens."""
    from leap_finetune.data.readers import read_dataset
    from leap_finetune.data.sft_rows import check_sft_row
    from leap_finetune.validate.loader import load_config

    tokenizer, renderer, _ = prepare({**cfg, "dataset": {**cfg["dataset"], "limit": 10, "cache": False}})
    resolved = load_config(cfg)
    rows = read_dataset(resolved.dataset.path).rows
    texts = [renderer.render(c.messages, c.tools)[0] for c in (check_sft_row(r)[0] for r in rows)]
    timings = []
    for offsets in (False, True):
        started = time.perf_counter()
        tokens = 0
        for i in range(0, len(texts), 512):
            encoded = tokenizer(texts[i : i + 512], add_special_tokens=False, return_offsets_mapping=offsets)
            tokens += sum(len(ids) for ids in encoded["input_ids"])
        timings.append(time.perf_counter() - started)
    return timings[0], timings[1], tokens


def memory_child(path: str, model: str, processes: int) -> None:
    """Run in a fresh process: RSS after imports, then peak RSS (this process and its workers) of preparing."""
    import pyarrow  # noqa: F401

    import leap_finetune.data.chunks  # noqa: F401
    from leap_finetune.data.prepare import prepare_data
    from leap_finetune.launch.checks import prepare  # noqa: F401 - the imports `validate` does
    from leap_finetune.models.loading import load_tokenizer
    from leap_finetune.validate.loader import load_config

    tokenizer = load_tokenizer(model, None)
    cfg = config(Path(path), model, processes, cache=True)
    resolved = load_config(cfg)  # (imports TRL and torch: the training arguments are checked)
    baseline = _rss_mb()
    from leap_finetune.launch.checks import prepare as prepare_fn

    started = time.perf_counter()
    _, _, prepared = prepare_fn(resolved)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    del tokenizer, prepare_data
    print(
        json.dumps(
            {
                "baseline_mb": baseline,
                "peak_mb": peak,
                "worker_peak_mb": workers,
                "seconds": seconds,
                "rows": len(prepared.train) + len(prepared.eval),
                "tokens": prepared.train.tokens + prepared.eval.tokens,
            }
        )
    )


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--memory-rows", type=int, default=100000)
    parser.add_argument("--model", default="tiny-lfm2")
    parser.add_argument("--memory-processes", default="1,all", help="process counts for the memory runs")
    parser.add_argument("--skip-speed", action="store_true", help="only the memory runs")
    parser.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.memory_child[1], int(args.memory_child[2]))
        return
    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="leap-bench-data-"))
    os.environ["LEAP_FINETUNE_CACHE"] = str(work / "cache")
    path = work / "rows.jsonl"
    if not args.skip_speed:
        speed(args, path, cores)
    if args.memory_rows:
        memory_path = work / "memory.jsonl"
        started = time.perf_counter()
        write_rows(memory_path, args.memory_rows)
        print(
            f"(wrote {args.memory_rows:,} rows, {memory_path.stat().st_size / 1e9:.2f} GB, in "
            f"{time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        for processes in [cores if p == "all" else int(p) for p in args.memory_processes.split(",")]:
            env = {**os.environ, "LEAP_FINETUNE_CACHE": str(work / f"cache-memory-{processes}")}
            out = subprocess.run(
                [sys.executable, __file__, "--memory-child", str(memory_path), args.model, str(processes)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| memory, {args.memory_rows:,} rows ({figures['tokens'] / figures['rows']:.0f} tokens a row), "
                f"{processes} process(es) | peak RSS {figures['peak_mb']:,.0f} MB (after imports "
                f"{figures['baseline_mb']:,.0f} MB; child processes' peak {figures['worker_peak_mb']:,.0f} MB, "
                f"mostly pages shared with the parent) | {figures['seconds']:.0f} s, "
                f"{figures['rows'] / figures['seconds']:,.0f} rows/s",
                flush=True,
            )


def speed(args, path: Path, cores: int) -> None:
    write_rows(path, args.rows)
    cfg = config(path, args.model, 1, cache=False)
    floor, floor_offsets, tokens = floor_seconds(cfg)
    prepare({**cfg, "dataset": {**cfg["dataset"], "limit": 600}})  # imports and first-call set-up, not timed
    results = {}
    for label, processes, cache in (
        ("one process", 1, False),
        (f"{cores} processes", cores, False),
        (f"{cores} processes + cache write", cores, True),
        ("cache read", cores, True),
    ):
        started = time.perf_counter()
        _, _, prepared = prepare(config(path, args.model, processes, cache))
        results[label] = (time.perf_counter() - started, prepared)
    one = results["one process"][0]
    print(
        f"\n{args.rows:,} rows, {tokens:,} tokens ({tokens / args.rows:.0f} a row), {cores} cores, model {args.model}"
    )
    rows = [("floor: tokenizer(texts), 1 core", floor, ""), ("  with offsets", floor_offsets, "")]
    rows += [
        (
            f"ours, {label}",
            seconds,
            f"{seconds / floor:.2f}x floor, {args.rows / seconds:,.0f} rows/s, {one / seconds:.2f}x one process",
        )
        for label, (seconds, _) in results.items()
    ]
    for label, seconds, note in rows:
        print(f"| {label:<38} | {seconds:8.2f} s | {note}")
    same = {p.train.fingerprint() for _, p in results.values()}
    print(f"identical prepared rows in every mode: {len(same) == 1}", flush=True)


if __name__ == "__main__":
    main()
