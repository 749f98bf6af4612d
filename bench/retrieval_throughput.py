"""Embedding training throughput on a CUDA machine: LFM2-350M architecture (random weights) through
leap-finetune's `run_config`, against sentence-transformers' own trainer with the same loss, batch and
model in the same run; then the largest batch the cached (GradCache) loss trains in memory.

python bench/retrieval_throughput.py [--steps 30] [--batch 64] [--out FILE]

Pairs/s = rows per step x steps after the first 5 / their wall time (a callback with CUDA syncs). Queries
~16 tokens, documents ~200 tokens. MFU: 6 x the encoder's non-embedding parameters per token (the token
embedding is a lookup; there is no LM head) plus causal attention, for the tokens of a pair (query and document
as tokenized, cut at 32 / 256), against the bf16 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
WARMUP = 5


def make_rows(path: Path, count: int, seed: int = 0, doc_words: int = 180) -> None:
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly mice".split()
    rng = random.Random(seed)
    with path.open("w") as handle:
        for i in range(count):
            handle.write(
                json.dumps(
                    {
                        "query": f"q{i} " + " ".join(rng.choice(words) for _ in range(12)),
                        "positive": f"d{i} " + " ".join(rng.choice(words) for _ in range(doc_words)),
                    }
                )
                + "\n"
            )


class Clock:
    def __init__(self):
        self.times: list[float] = []

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class StepClock(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                clock.times.append(time.perf_counter())

        return StepClock()

    def pairs_per_s(self, batch: int) -> float:
        times = self.times[WARMUP:]
        return batch * (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


def flops_per_pair(model_dir: Path, data: Path) -> float:
    """Training FLOPs of one (query, document) pair for the encoder in `model_dir` (see the module docstring)."""
    import statistics

    from transformers import AutoConfig, AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    rows = [json.loads(line) for line in data.open()][:500]
    lengths = [min(32, len(tokenizer(r["query"])["input_ids"])) for r in rows] + [
        min(256, len(tokenizer(r["positive"])["input_ids"])) for r in rows
    ]
    attention_layers = sum(t == "full_attention" for t in getattr(config, "layer_types", []))
    per_pair = 2 * statistics.mean(lengths)  # a query and a document
    context = sum(n * n for n in lengths) / (2 * sum(lengths))
    return per_pair * (6 * params + 12 * attention_layers * config.hidden_size * context)


def leap(
    model_dir: Path,
    data: Path,
    work: Path,
    steps: int,
    batch: int,
    loss: str = "mnrl",
    kind: str = "embedding",
    extra: dict | None = None,
) -> float:
    from leap_finetune.api import run_config

    clock = Clock()
    config = {
        "project_name": f"bench-{kind}-{loss}-{batch}",
        "model_name": str(model_dir),
        "training_type": kind,
        "dataset": {"path": str(data), "limit": batch * steps},
        "retrieval": {"loss": loss, "mini_batch_size": 64, "query_max_length": 32, "document_max_length": 256},
        "training_config": {
            "max_steps": steps,
            "per_device_train_batch_size": batch,
            "logging_steps": 5,
            "save_strategy": "no",
            "learning_rate": 1e-5,
            **(extra or {}),
        },
    }
    run_config(config, outputs_root=work / "outputs", callbacks=[clock.callback()])
    return clock.pairs_per_s(batch)


def sentence_transformers_own(
    model_dir: Path, data: Path, work: Path, steps: int, batch: int, kind: str = "embedding"
) -> float:
    """sentence-transformers' own trainer and loss, as its docs train a model: SentenceTransformerTrainer with
    MultipleNegativesRankingLoss, or (ColBERT) MultiVectorEncoderTrainer with its MaxSim loss."""
    from datasets import load_dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "colbert":
        from sentence_transformers.multi_vector_encoder import (
            MultiVectorEncoder,
        )
        from sentence_transformers.multi_vector_encoder import (
            MultiVectorEncoderTrainer as Trainer,
        )
        from sentence_transformers.multi_vector_encoder import (
            MultiVectorEncoderTrainingArguments as Arguments,
        )
        from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss as Loss

        model = MultiVectorEncoder(str(model_dir), device=device)
        model.max_seq_length = 256
    else:
        from sentence_transformers import SentenceTransformerTrainer as Trainer
        from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss as Loss

        transformer = Transformer(str(model_dir), max_seq_length=256)
        model = SentenceTransformer(
            modules=[transformer, Pooling(transformer.get_embedding_dimension(), "lasttoken"), Normalize()],
            device=device,
        )
    dataset = load_dataset("json", data_files=str(data), split="train").select(range(batch * steps))
    args = Arguments(
        output_dir=str(work / "st"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        bf16=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(),
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        learning_rate=1e-5,
        batch_sampler="no_duplicates",
    )
    clock = Clock()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        loss=Loss(model),
        callbacks=[clock.callback()],
    )
    trainer.train()
    return clock.pairs_per_s(batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cached", default="1024,4096,8192")
    parser.add_argument("--smoke", action="store_true", help="CPU check of this script with tiny-lfm2")
    parser.add_argument(
        "--only-cached",
        action="store_true",
        help="only the cached-loss batch sizes, 1 step each, documents of ~20 tokens (memory: the "
        "batch x batch score matrix and the stored embeddings grow with the batch, activations with "
        "the mini-batch only; short texts keep the search fast)",
    )
    parser.add_argument("--types", default="embedding,colbert")
    parser.add_argument(
        "--variants",
        default="st,leap,leap-plain",
        help="st (sentence-transformers' own trainer), leap (the default), leap-plain (padding_free and "
        "compile_layers false: the default before issue #30), leap-padded (compile_layers only)",
    )
    parser.add_argument("--work", default="/tmp/leap-retrieval-bench")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import sentence_transformers
    import transformers
    from sft_throughput import build_model

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "lfm2-350m"
    if args.smoke:
        from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

        tokenizer = load_tiny_tokenizer("tiny-lfm2")
        build_tiny_model("tiny-lfm2", tokenizer).save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    else:
        build_model("350m", model_dir)
    data = work / "pairs.jsonl"
    make_rows(
        data,
        max([args.batch * args.steps] + [2 * int(b) for b in args.cached.split(",") if b]),
        doc_words=20 if args.only_cached else 180,
    )
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke)"
    lines = [
        f"### {datetime.date.today()} - embedding training - {device} - torch "
        f"{torch.__version__}, transformers {transformers.__version__}, sentence-transformers "
        f"{sentence_transformers.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"LFM2-350M architecture, last-token pooling; queries ~16 tokens, documents ~200 tokens; batch {args.batch}, "
        f"{args.steps} steps, pairs/s over steps {WARMUP + 1}-{args.steps}.",
        "",
        "| path | pairs/s | MFU | peak GiB |",
        "| --- | --- | --- | --- |",
    ]
    per_pair = flops_per_pair(model_dir, data)
    peak_flops = None
    if torch.cuda.is_available():
        from sft_throughput import matmul_peak

        peak_flops = matmul_peak()
        lines.insert(
            4,
            f"bf16 matmul peak measured in this run: {peak_flops / 1e12:.0f} TFLOP/s; {per_pair / 1e9:.2f} GFLOP per pair.",
        )

    def record(label, fn):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            speed = fn()
            peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
            mfu = f"{100 * speed * per_pair / peak_flops:.1f}%" if peak_flops and speed == speed else "-"
            shown = f"{speed:,.0f}" if speed == speed else "fits (too few steps for a speed)"
            lines.append(f"| {label} | {shown} | {mfu} | {peak:.1f} |")
        except torch.cuda.OutOfMemoryError:
            lines.append(f"| {label} | out of memory | | |")
        except Exception as err:  # noqa: BLE001 - a failed variant is a row
            lines.append(f"| {label} | failed: {type(err).__name__}: {str(err).splitlines()[0][:120]} | | |")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(lines[-1], flush=True)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")

    variants = {
        "leap": ("leap-finetune (default)", {}),
        "leap-plain": (
            "leap-finetune, padding_free + compile_layers false",
            {"padding_free": False, "compile_layers": False},
        ),
        "leap-padded": ("leap-finetune, padding_free false", {"padding_free": False}),
    }
    for kind in [] if args.only_cached else args.types.split(","):
        loss = "MaxSim MNRL" if kind == "colbert" else "MNRL"
        for variant in args.variants.split(","):
            if variant == "st":
                record(
                    f"{kind}: sentence-transformers' own trainer, {loss}, bf16, batch {args.batch}",
                    lambda kind=kind: sentence_transformers_own(model_dir, data, work, args.steps, args.batch, kind),
                )
                continue
            label, extra = variants[variant]
            record(
                f"{kind}: {label}, {loss}, batch {args.batch}",
                lambda kind=kind, extra=extra: leap(
                    model_dir, data, work, args.steps, args.batch, kind=kind, extra=extra
                ),
            )
    for size in (int(b) for b in args.cached.split(",") if b):
        # 2 steps (1 with --only-cached): whether it fits, and its memory (too few steps for a speed figure)
        steps = 1 if args.only_cached else 2
        record(
            f"leap-finetune, cached_mnrl (mini-batch 64), batch {size} (fits?)",
            lambda size=size, steps=steps: leap(model_dir, data, work, steps, size, loss="cached_mnrl"),
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
