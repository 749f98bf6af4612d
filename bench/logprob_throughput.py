"""Log-prob multiple choice: batched scoring vs a naive one-forward-per-option loop.

python bench/logprob_throughput.py [--questions 64] [--options 4] [--batch-size 32] [--model tiny-lfm2|lfm2-350m-arch]

Uses the built-in tiny model on CPU, or the LFM2-350M architecture (random weights, no download)
on a GPU. Checks that both paths give the same scores, prints items/s for each, and appends the
result (date, machine, versions, command) to bench/RESULTS.md with --record.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

from leap_finetune.config.schema_evals import EvalsConfig
from leap_finetune.data.chat_templates import load_chat_template
from leap_finetune.data.render import Renderer
from leap_finetune.evaluation.logprob import score_options
from leap_finetune.evaluation.rows import BenchmarkItem
from leap_finetune.evaluation.runner import LoadedBenchmark, _logprob
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--options", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="tiny-lfm2", choices=["tiny-lfm2", "lfm2-350m-arch"])
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    if args.model == "tiny-lfm2":
        model = build_tiny_model("tiny-lfm2", tokenizer)
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from gpu_check import LFM2_350M

        model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**{**LFM2_350M, "vocab_size": len(tokenizer)}))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model.to(device, dtype).eval()
    model.config.use_cache = False
    renderer = Renderer(tokenizer, load_chat_template("lfm2", tokenizer), "all", None)
    words = ["red", "blue", "green", "gold", "pink", "gray", "teal", "navy"]
    items = []
    for q in range(args.questions):
        prompt = [{"role": "user", "content": f"Question {q}: which colour comes after {words[q % 8]}? " * 3}]
        options = [f"It is {words[(q + k) % 8]} and nothing else." for k in range(args.options)]
        items.append(BenchmarkItem("synthetic", f"row {q + 1}", prompt, options=options, answer_id=0))
    evals = EvalsConfig(benchmarks=[{"name": "x", "path": "x", "metric": "logprob_mcq"}], batch_size=args.batch_size)
    bench = LoadedBenchmark("x", "logprob_mcq", items)

    def timed(fn):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - start

    _logprob(model, renderer, evals, LoadedBenchmark("x", "logprob_mcq", items[:2]))  # warm-up
    naive, naive_s = timed(lambda: [score_options(model, renderer, i.prompt, i.options) for i in items])
    (metrics, predictions), batched_s = timed(lambda: _logprob(model, renderer, evals, bench))
    naive_flat = [s.logprob for scores in naive for s in scores]
    batched_flat = [lp for p in predictions for lp in p["option_logprobs"]]
    max_diff = max(abs(a - b) for a, b in zip(naive_flat, batched_flat))
    rows = [
        f"### {datetime.date.today()} - {torch.cuda.get_device_name(0) if device == 'cuda' else platform.processor() or 'CPU'}"
        f" ({device}, {str(dtype).split('.')[-1]}) - torch {torch.__version__}, transformers {transformers.__version__}",
        "",
        f"Command: `python bench/logprob_throughput.py --model {args.model} --questions {args.questions} "
        f"--options {args.options} --batch-size {args.batch_size}`",
        "",
        "| path | questions/s | options/s | seconds |",
        "| --- | --- | --- | --- |",
        f"| naive: one forward per option | {len(items) / naive_s:.1f} | {len(items) * args.options / naive_s:.1f} | {naive_s:.2f} |",
        f"| batched ({args.batch_size} sequences per forward) | {len(items) / batched_s:.1f} | "
        f"{len(items) * args.options / batched_s:.1f} | {batched_s:.2f} |",
        "",
        f"Speed-up {naive_s / batched_s:.1f}x; max |log-prob difference| between the paths {max_diff:.1e} "
        f"(option log-probs rounded to 1e-4 in the predictions).",
        "",
    ]
    text = "\n".join(rows)
    print(text)
    if args.record:
        with (Path(__file__).parent / "RESULTS.md").open("a") as handle:
            handle.write("\n## Log-prob multiple choice throughput\n\n" + text)


if __name__ == "__main__":
    main()
