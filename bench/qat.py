"""Issue #50: quantization-aware training against post-training quantization, same rows, same steps, one run.

    python bench/qat.py [--models 350m,1.2b] [--target q4_0] [--facts 2000] [--epochs 8] [--qat-from 0.9]
                        [--out qat.json]
    python bench/qat.py --smoke        # tiny-lfm2 on the CPU: checks the script

The task is one that 4-bit rounding measurably hurts: memorized facts (random 4-letter codes -> one of 12 words),
capacity-bound, scored by exact match of the greedy answer. For each model (random weights of the published LFM2
architecture, bench/sft_throughput.py): an SFT run; then the same run with `qat: {target, start_step}` from
`--qat-from` of the steps. Each run's saved model is scored unrounded (bf16) and rounded to the target
(models/qat.py: value for value llama.cpp's quantizer, so the scores are those of the GGUF file), and the KL of the
rounded model's next-token distributions from the SFT run's unrounded one over the answers. QAT's overhead: its
tokens/s after the switch against the SFT run's. Row: {model, target, bf16_score, ptq_score, qat_score, ptq_kl,
qat_kl, qat_overhead}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]

import torch  # noqa: E402

WORDS = "red blue green gold pink gray teal navy lime plum rose sand".split()


def facts(path: Path, count: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for _ in range(count):
        code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(4))
        rows.append({"messages": [{"role": "user", "content": f"Code {code}?"},
                                  {"role": "assistant", "content": rng.choice(WORDS)}]})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def rounded(model, target: str):
    from leap_finetune.models.qat import can_quantize, quantized

    with torch.no_grad():
        for name, module in model.named_modules():
            if "lm_head" not in name and can_quantize(module, target):
                module.weight.copy_(quantized(module.weight, target))
    return model


def answers(model, tokenizer, rows: list[dict], batch: int = 64) -> tuple[float, list[torch.Tensor]]:
    """(exact-match share, the next-token log-distribution at each answer's first token)."""
    tokenizer.padding_side = "left"
    correct, dists = 0, []
    device = next(model.parameters()).device
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        prompts = [tokenizer.apply_chat_template(r["messages"][:1], tokenize=False, add_generation_prompt=True)
                   for r in chunk]  # fmt: skip
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            dists.append(model(**encoded).logits[:, -1].float().log_softmax(-1).cpu())
            out = model.generate(**encoded, max_new_tokens=3, do_sample=False)
        for row, ids in zip(chunk, out[:, encoded.input_ids.shape[1] :], strict=True):
            correct += tokenizer.decode(ids, skip_special_tokens=True).strip() == row["messages"][1]["content"]
    return correct / len(rows), dists


def kl(reference: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    total = sum(float((r.exp() * (r - o)).sum()) for r, o in zip(reference, other, strict=True))
    return total / sum(r.shape[0] for r in reference)


def train(model_dir: str, data: Path, work: Path, epochs: int, qat: dict | None) -> dict:
    from leap_finetune.api import run_config

    config = {
        "project_name": f"qat-bench-{'qat' if qat else 'sft'}",
        "model_name": model_dir,
        "training_type": "sft",
        "dataset": {"path": str(data)},
        "training_config": {"extends": "DEFAULT_SFT", "num_train_epochs": epochs, "learning_rate": 3e-4,
                            "per_device_train_batch_size": 64, "save_strategy": "no", "eval_strategy": "no",
                            "logging_steps": 1, "max_length": 64},
    }  # fmt: skip
    if qat:
        config["qat"] = qat
    return run_config(config, outputs_root=work / "outputs")


def speed_after(run_dir: str, step: int, settle: int = 3) -> float:
    """Median tokens/s of the steps after `step` + `settle`: the switch to the rounded forward recompiles each
    compiled layer once (seconds), which is not the per-step cost. (2026-12-06 on the H100 the median was of two
    10-step windows after the switch, one of them holding that recompile: 2.05x.)"""
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "tokens_per_second" in r and r["step"] > step]
    speeds = [r["tokens_per_second"] for r in timed if r["step"] > step + settle] or [  # (a short smoke run)
        r["tokens_per_second"] for r in timed
    ]
    return statistics.median(speeds) if speeds else float("nan")


def one_model(key: str, args, work: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.smoke:
        model_dir = "tiny-lfm2"
    else:
        from sft_throughput import build_model

        model_dir = str(work / "models" / key)
        if not (Path(model_dir) / "config.json").exists():
            build_model(key, Path(model_dir))
    rows = facts(work / "facts.jsonl", args.facts)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sft = train(model_dir, work / "facts.jsonl", work, args.epochs, None)
    steps = sft["global_step"]
    start = int(steps * args.qat_from)
    qat = train(model_dir, work / "facts.jsonl", work, args.epochs, {"target": args.target, "start_step": start})
    load = lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()  # noqa: E731
    tokenizer = AutoTokenizer.from_pretrained(sft["model_dir"])
    bf16_score, reference = answers(load(sft["model_dir"]), tokenizer, rows)
    ptq_score, ptq = answers(rounded(load(sft["model_dir"]), args.target), tokenizer, rows)
    qat_score, quantized = answers(rounded(load(qat["model_dir"]), args.target), tokenizer, rows)
    return {
        "model": key,
        "target": args.target,
        "bf16_score": round(bf16_score, 4),
        "ptq_score": round(ptq_score, 4),
        "qat_score": round(qat_score, 4),
        "ptq_kl": round(kl(reference, ptq), 6),
        "qat_kl": round(kl(reference, quantized), 6),
        "qat_overhead": round(speed_after(sft["run_dir"], start) / speed_after(qat["run_dir"], start), 3),
        "steps": steps,
        "qat_from_step": start,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="350m,1.2b")
    parser.add_argument("--target", default="q4_0")
    parser.add_argument("--facts", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--qat-from", type=float, default=0.9, help="the share of the steps trained before QAT")
    parser.add_argument("--work", default="/tmp/leap-qat-bench")
    parser.add_argument("--out", default="qat-results.json")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.facts, args.epochs = "tiny", 48, 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for key in args.models.split(","):
        results.append(one_model(key, args, work))
        print(json.dumps(results[-1]), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{'model':<8} {'bf16':>6} {'PTQ':>6} {'QAT':>6} {'PTQ KL':>9} {'QAT KL':>9} {'overhead':>9}")
    for r in results:
        print(f"{r['model']:<8} {r['bf16_score']:>6} {r['ptq_score']:>6} {r['qat_score']:>6} {r['ptq_kl']:>9} "
              f"{r['qat_kl']:>9} {r['qat_overhead']:>9}")  # fmt: skip


if __name__ == "__main__":
    main()
