"""DPO and KTO throughput on a CUDA machine: leap-finetune's default against TRL's trainers with their defaults,
same rows, same batch, same run.

python bench/preference_throughput.py [--model 1.2b] [--steps 30] [--types dpo,kto] [--modes full,lora] [--out FILE]

- The model: bench/sft_throughput.py's random-weight LFM2 architecture (saved in bf16, as LiquidAI ships it).
- Rows: synthetic prompts of 50-600 tokens and answers of 50-700 (log-normal), chosen and rejected of different
  lengths; KTO gets the same prompts with one labelled completion each.
- Tokens/s counts the real tokens of every sequence the policy trains on (prompt + chosen + prompt + rejected for
  DPO; prompt + completion for KTO, its KL pairs not counted), from the rows themselves (the trainers' own token
  counters differ), over the steps after warm-up: (steps - warm-up) x batch rows / their wall time.
- MFU: 6 N per trained token for the policy plus 2 N for the reference's forward (full fine-tuning and LoRA
  alike: LoRA still runs the whole model forward and backward), against the bf16 matmul peak measured in the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import TrainerCallback

from bench.sft_throughput import build_model, matmul_peak

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly mice".split()
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}


def _text(rng, tokens: int, per_word: float) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, int(tokens / per_word))))


def make_rows(folder: Path, rows: int, seed: int = 0) -> tuple[Path, Path, list[int], list[int]]:
    """pairs.jsonl (DPO) and labelled.jsonl (KTO); returns the paths and each row's real tokens (DPO: both
    sequences; KTO: the one)."""
    from leap_finetune.models.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    sample = " ".join(WORDS * 10)
    per_word = len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / (len(WORDS) * 10)
    rng = random.Random(seed)
    pairs, labelled, pair_tokens, labelled_tokens = [], [], [], []
    for i in range(rows):
        prompt_len = int(min(600, max(50, rng.lognormvariate(math.log(200), 0.6))))
        chosen_len, rejected_len = (int(min(700, max(50, rng.lognormvariate(math.log(250), 0.6)))) for _ in range(2))
        prompt = _text(rng, prompt_len, per_word)
        chosen, rejected = _text(rng, chosen_len, per_word), _text(rng, rejected_len, per_word)
        user = [{"role": "user", "content": prompt}]
        pairs.append(
            {
                "prompt": user,
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
        pair_tokens.append(2 * prompt_len + chosen_len + rejected_len)
        labelled.append(
            {"prompt": user, "completion": [{"role": "assistant", "content": chosen}], "label": bool(i % 2)}
        )
        labelled_tokens.append(prompt_len + chosen_len)
    pair_path, labelled_path = folder / "pairs.jsonl", folder / "labelled.jsonl"
    pair_path.write_text("".join(json.dumps(r) + "\n" for r in pairs))
    labelled_path.write_text("".join(json.dumps(r) + "\n" for r in labelled))
    return pair_path, labelled_path, pair_tokens, labelled_tokens


class StepClock(TrainerCallback):
    """Wall time of the steps after `warmup` (the GPU synchronised at both ends)."""

    def __init__(self, warmup: int):
        self.warmup, self.start, self.end, self.steps = warmup, None, None, 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup:
            torch.cuda.synchronize()
            self.start = time.perf_counter()
        elif state.global_step > self.warmup:
            torch.cuda.synchronize()
            self.end, self.steps = time.perf_counter(), state.global_step - self.warmup


def leap_run(kind: str, mode: str, model_dir: Path, data: Path, work: Path, steps: int, batch: int, extra: dict):
    from leap_finetune.api import run_config

    clock = StepClock(warmup=10)
    config = {
        "project_name": f"bench-{kind}-{mode}",
        "model_name": str(model_dir),
        "training_type": kind,
        "dataset": {"path": str(data)},
        "training_config": {
            "max_steps": steps,
            "per_device_train_batch_size": batch,
            "logging_steps": 5,
            "save_strategy": "no",
            "max_length": 2048,
            "learning_rate": 1e-6,
            **extra,
        },
    }
    if mode == "lora":
        config["peft_config"] = {"extends": "DEFAULT_LORA", **LORA}
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    summary = run_config(config, outputs_root=work / "outputs", callbacks=[clock])
    losses = [json.loads(line).get("loss") for line in (Path(summary["run_dir"]) / "metrics.jsonl").open()]
    return clock, time.perf_counter() - start, [x for x in losses if x is not None][:3]


def trl_run(kind: str, mode: str, model_dir: Path, data: Path, work: Path, steps: int, batch: int):
    """TRL's DPOTrainer / KTOTrainer with their defaults on the same rows (their own tokenization)."""
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    clock = StepClock(warmup=10)
    config_cls, trainer_cls = (DPOConfig, DPOTrainer) if kind == "dpo" else (KTOConfig, KTOTrainer)
    args = config_cls(
        output_dir=str(work / f"trl-{kind}-{mode}"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        max_length=2048,
        learning_rate=1e-6,
        disable_tqdm=True,
    )
    dataset = load_dataset("json", data_files=str(data), split="train")
    peft = LoraConfig(task_type="CAUSAL_LM", **LORA) if mode == "lora" else None
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer = trainer_cls(model=str(model_dir), args=args, train_dataset=dataset, peft_config=peft, callbacks=[clock])
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r][:3]
    del trainer
    return clock, time.perf_counter() - start, losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="1.2b")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--types", default="dpo,kto")
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument(
        "--variants",
        default="trl,leap",
        help="trl, leap, leap-eager (compile_layers: false), leap-padded (DPO without flat rows: padding_free: false)",
    )
    parser.add_argument("--work", default="/tmp/leap-bench-pref")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak()
    rows = args.steps * args.batch
    pairs, labelled, pair_tokens, labelled_tokens = make_rows(work, rows)
    model_dir = work / f"lfm2-{args.model}"
    n_params, _ = build_model(args.model, model_dir)
    import trl

    lines = [
        f"### {datetime.date.today()} - {torch.cuda.get_device_name(0)} - torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        f"bf16 matmul peak measured in this run: {peak / 1e12:.0f} TFLOP/s. LFM2-{args.model} ({n_params / 1e6:.0f}M), "
        f"batch {args.batch}, {args.steps} steps, timed after step 10. DPO rows: {statistics.mean(pair_tokens):.0f} "
        f"real tokens per pair (both sequences); KTO: {statistics.mean(labelled_tokens):.0f} per row.",
        "",
        "| type | tuning | path | real tokens/s | vs TRL | MFU | peak GiB | wall s | first losses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in args.types.split(","):
        data, tokens = (pairs, pair_tokens) if kind == "dpo" else (labelled, labelled_tokens)
        per_step = statistics.mean(tokens) * args.batch
        for mode in args.modes.split(","):
            baseline = None
            for variant in args.variants.split(","):
                try:
                    if variant == "trl":
                        clock, wall, losses = trl_run(kind, mode, model_dir, data, work, args.steps, args.batch)
                    else:
                        extra = {
                            "leap-eager": {"compile_layers": False},
                            "leap-padded": {"padding_free": False},
                            "leap-no-workers": {"dataloader_num_workers": 0},
                        }.get(variant, {})
                        clock, wall, losses = leap_run(kind, mode, model_dir, data, work, args.steps, args.batch, extra)
                    speed = per_step * clock.steps / (clock.end - clock.start)
                except Exception as err:  # noqa: BLE001 - record the failing path and go on
                    lines.append(f"| {kind} | {mode} | {variant} | failed: {type(err).__name__}: {str(err)[:150]} |")
                    continue
                finally:
                    torch.cuda.empty_cache()
                baseline = speed if variant == "trl" else baseline
                mfu = speed * 8 * n_params / peak  # 6N policy + 2N reference forward
                ratio = f"{speed / baseline:.2f}x" if baseline else ""
                peak_gib = torch.cuda.max_memory_allocated() / 2**30
                shown = ", ".join(f"{x:.4f}" for x in losses)
                lines.append(
                    f"| {kind} | {mode} | {variant} | {speed:,.0f} | {ratio} | {100 * mfu:.1f}% | {peak_gib:.1f} | "
                    f"{wall:.0f} | {shown} |"
                )
                if args.out:
                    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
