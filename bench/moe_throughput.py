"""Issue #49: LFM2-MoE training speed and memory, leap-finetune against TRL's trainers, same rows, same run.

    python bench/moe_throughput.py [--model 8b-a1b] [--cases sft-lora,sft-qlora,sft-full,dpo-lora] [--steps 20]
                                   [--out moe.json]
    python bench/moe_throughput.py --smoke     # tiny-lfm2-moe on the CPU: checks the script, measures nothing

- The model: LiquidAI's published LFM2-8B-A1B architecture (memory/shapes.py: 8.3B parameters, 1.56B active; 32
  experts, 4 per token) with random bf16 weights and the bundled tokenizer, saved to a local folder.
- SFT rows: bench/sft_throughput.py's conversations (200-2048 tokens, log-normal); DPO rows: bench/
  preference_throughput.py's pairs. Tokens/s: SFT from each run's metrics.jsonl after warm-up (real tokens); DPO
  from the rows over the timed steps (preference_throughput's StepClock).
- MFU on active parameters: 6 x active parameters per trained token (+ causal attention, as sft_throughput counts
  it) against the bf16 matmul peak measured in the same run; DPO adds the reference's forward (2 x active).
- leap-finetune runs its defaults for each mode (LoRA: DEFAULT_LORA; QLoRA: DEFAULT_QLORA; full: the bf16 weights
  with Kahan-summation AdamW, activation checkpointing); TRL its defaults with the same LoRA targets (QLoRA: nf4 as
  its docs set it; full: bf16 weights, its AdamW).
Each case's row: {model, method, mode, leap_tok_s, trl_tok_s, leap_peak_gib, trl_peak_gib, mfu_active}.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # (bench/ and the root)

import torch  # noqa: E402

MODELS = {"8b-a1b": "LFM2-8B-A1B", "24b-a2b": "LFM2-24B-A2B"}
LEAP_MODES = {
    "lora": {"peft_config": {"extends": "DEFAULT_LORA"}, "training": {}},
    "qlora": {"peft_config": {"extends": "DEFAULT_QLORA"}, "training": {}},
    "full": {"training": {"optimizer_precision": "bf16_kahan", "activation_checkpointing": True}},
}


def build_model(key: str, folder: Path) -> Path:
    """The published architecture with random bf16 weights and the bundled tokenizer (bench/memory.py)."""
    from memory import build_published

    return build_published(MODELS[key], folder)


def active_flops(model_dir: str, lengths: list[int]) -> float:
    """Training FLOPs per token on the active parameters (6 N_active) plus causal attention."""
    from leap_finetune.memory.shapes import model_shape

    shape = model_shape(model_dir)
    mean_context = sum(n * n for n in lengths) / (2 * sum(lengths))
    return 6 * shape.active_parameters + 12 * shape.attention_layers * shape.hidden * mean_context


def leap_sft(mode: str, model: str, data: Path, work: Path, steps: int) -> dict:
    from sft_throughput import measured_leap_run

    chosen = LEAP_MODES[mode]
    config = {
        "project_name": f"moe-sft-{mode}",
        "model_name": model,
        "training_type": "sft",
        "dataset": {"path": str(data)},
        "training_config": {
            "extends": "DEFAULT_SFT",
            "max_steps": steps,
            "per_device_train_batch_size": 8,
            "logging_steps": 5,
            "save_strategy": "no",
            "eval_strategy": "no",
            "max_length": 2048,
            "learning_rate": 1e-5,
            **chosen["training"],
        },
    }
    if "peft_config" in chosen:
        config["peft_config"] = chosen["peft_config"]
    result = measured_leap_run(config, work, warmup_steps=5)
    shutil.rmtree(work / "outputs", ignore_errors=True)
    return result


def trl_sft(mode: str, model: str, data: Path, work: Path, steps: int) -> dict:
    from budget_peers import trl_adapter_options
    from datasets import load_dataset
    from sft_throughput import tokens_per_second
    from trl import SFTConfig, SFTTrainer

    from leap_finetune.recipes.callbacks import MetricsLog

    out = work / f"trl-sft-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    peft, init = trl_adapter_options(mode)
    args = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        max_length=2048,
        learning_rate=2e-4 if peft else 1e-5,
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
        model_init_kwargs=init or None,
    )
    torch.cuda.reset_peak_memory_stats()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        peft_config=peft,
        callbacks=[MetricsLog(out / "metrics.jsonl")],
    )
    trainer.train()
    result = {
        "tokens_per_second": tokens_per_second(out / "metrics.jsonl", warmup_steps=5),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
    del trainer
    return result


def dpo(side: str, model: str, pairs: Path, tokens: list[int], work: Path, steps: int) -> dict:
    import preference_throughput as pref

    torch.cuda.reset_peak_memory_stats()
    if side == "leap":
        clock, _, _ = pref.leap_run("dpo", "lora", Path(model), pairs, work, steps, 4, {})
    else:
        clock, _, _ = pref.trl_run("dpo", "lora", Path(model), pairs, work, steps, 4)
    shutil.rmtree(work / "outputs", ignore_errors=True)
    seconds = (clock.end - clock.start) if clock.start and clock.end else float("nan")
    per_row = statistics.mean(tokens)
    return {
        "tokens_per_second": clock.steps * 4 * per_row / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def one_case(case: str, name: str, model: str, data: dict, work: Path, steps: int, peak: float) -> dict:
    method, mode = case.split("-")
    row = {"model": name, "method": method, "mode": mode}
    for side in ("leap", "trl"):
        gc.collect()
        torch.cuda.empty_cache()
        try:
            if method == "sft":
                found = (leap_sft if side == "leap" else trl_sft)(mode, model, data["sft"], work, steps)
            else:
                found = dpo(side, model, data["pairs"], data["pair_tokens"], work, steps)
            row[f"{side}_tok_s"] = round(found["tokens_per_second"])
            row[f"{side}_peak_gib"] = round(found["peak_gib"], 2)
        except Exception as err:  # noqa: BLE001 - an out-of-memory or a failure is the row's answer
            row[f"{side}_tok_s"], row[f"{side}_peak_gib"] = None, None
            row[f"{side}_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    flops = active_flops(model, data["lengths"]) * (4 / 3 if method == "dpo" else 1)  # (DPO: + the reference)
    row["mfu_active"] = round(row["leap_tok_s"] * flops / peak, 4) if row.get("leap_tok_s") and peak else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="8b-a1b", choices=sorted(MODELS))
    parser.add_argument("--cases", default="sft-lora,sft-qlora,sft-full,dpo-lora")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work", default="/tmp/leap-moe-bench")
    parser.add_argument("--out", default="moe-results.json")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    import preference_throughput as pref
    from sft_throughput import make_data, matmul_peak

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    lengths = make_data(work / "sft.jsonl", rows=256)
    pairs, _, pair_tokens, _ = pref.make_rows(work, rows=256)
    data = {"sft": work / "sft.jsonl", "pairs": pairs, "pair_tokens": pair_tokens, "lengths": lengths}
    if args.smoke:  # (the CPU: the tiny MoE through leap-finetune's path only)
        print(json.dumps({"smoke": leap_sft("lora", "tiny-lfm2-moe", data["sft"], work, 2)["losses"]}))
        return
    model = str(build_model(args.model, work / "models" / args.model))
    peak = matmul_peak()
    rows = []
    for case in args.cases.split(","):
        rows.append(one_case(case, MODELS[args.model], model, data, work, args.steps, peak))
        print(json.dumps(rows[-1]), flush=True)
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{datetime.date.today()} {torch.cuda.get_device_name(0)}, bf16 peak {peak / 1e12:.0f} TFLOP/s")
    print(f"{'case':<10} {'leap tok/s':>11} {'TRL tok/s':>10} {'x':>5} {'leap GiB':>9} {'TRL GiB':>8} {'MFU act':>8}")
    for r in rows:
        ratio = r["leap_tok_s"] / r["trl_tok_s"] if r.get("leap_tok_s") and r.get("trl_tok_s") else float("nan")
        print(f"{r['method']}-{r['mode']:<6} {r.get('leap_tok_s')!s:>11} {r.get('trl_tok_s')!s:>10} {ratio:>5.2f} "
              f"{r.get('leap_peak_gib')!s:>9} {r.get('trl_peak_gib')!s:>8} {r.get('mfu_active')!s:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
