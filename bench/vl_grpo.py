"""GRPO on pictures (issue #55): rollout speed of leap-finetune's sampler (the pixels in the prefill, rl/sampler.py)
against TRL's GRPOTrainer with its defaults (transformers' generate with the images), each in the same run.

python bench/vl_grpo.py [--models 450m,1.6b] [--steps 6] [--engines leap,trl[,vllm]] [--out FILE] [--smoke]

- LFM2-VL-450M / LFM2-VL-1.6B architectures with random weights and their real processors (bench/vl_sft_throughput.py
  builds them: no download), bf16.
- 8 prompts x 8 generations per step, 256 new tokens (random weights rarely end early); each prompt a 512x512
  picture of shapes and a question.
- Each variant in its own process. Rollout tokens/s = completion tokens / seconds inside the trainer's generation
  call (CUDA-synchronised; bench/grpo_rollout.py's Timing), median over the steps after the first two; peak GPU
  memory of the process beside it.
- `vllm` (needs vLLM installed): leap-finetune's GRPO with `use_vllm: true, vllm_mode: colocate` - TRL's vLLM
  generation with the pictures as vLLM's multi-modal data - beside the sampler, same rows.
- --smoke: the tiny LFM2.5-VL on CPU, 8 new tokens (a check of this script, not a measurement).

Writes a JSON list of {model, leap_rollout_tok_s, trl_rollout_tok_s, peak_gib, trl_peak_gib, speedup} to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

PROMPTS, GENERATIONS, NEW_TOKENS, WARMUP = 8, 8, 256, 2
QUESTION = "Describe the shapes in the picture."


def make_prompts(work: Path, count: int, size: int) -> Path:
    """GRPO rows (`prompt` with an image part) over pictures of filled shapes."""
    from PIL import Image, ImageDraw

    rng = random.Random(0)
    (work / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(count):
        image = Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for _ in range(rng.randint(3, 8)):
            x, y = rng.randrange(size), rng.randrange(size)
            draw.rectangle([x, y, x + rng.randint(8, size // 2), y + rng.randint(8, size // 2)],
                           fill=tuple(rng.randrange(256) for _ in range(3)))  # fmt: skip
        name = f"img/{index:04d}.png"
        image.save(work / name)
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image", "image": name},
                                                            {"type": "text", "text": QUESTION}]}]})  # fmt: skip
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data


def length_reward(completions, **_):
    return [min(len(str(c)) / 1000, 1.0) for c in completions]


def settings(smoke: bool) -> dict:
    return {"use_cpu": True, "bf16": False} if smoke else {"bf16": True}


def child_trl(model_dir: Path, data: Path, work: Path, steps: int, smoke: bool) -> dict:
    """TRL's GRPOTrainer with its defaults, the processor as its processing class, images as TRL takes them."""
    from datasets import load_dataset
    from grpo_rollout import Timing
    from PIL import Image
    from transformers import AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    rows = load_dataset("json", data_files=str(data), split="train")

    def to_trl(row):
        return {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
            "image": Image.open(work / row["prompt"][0]["content"][0]["image"]).convert("RGB"),
        }

    dataset = rows.map(to_trl, remove_columns=rows.column_names)
    args = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=NEW_TOKENS,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_vllm=False,
        disable_tqdm=True,
        **settings(smoke),
    )
    timing = Timing()
    trainer = timing.wrap(GRPOTrainer)(
        model=str(model_dir),
        reward_funcs=length_reward,
        args=args,
        train_dataset=dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
        callbacks=[timing.clock()],
    )
    trainer.train()
    return timing.summary()


def child_leap(model_dir: Path, data: Path, work: Path, steps: int, smoke: bool, vllm: bool = False) -> dict:
    from grpo_rollout import Timing, timed_run_config

    engine = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3} if vllm else {}
    training = {"use_vllm": False, **engine, "max_steps": steps, "per_device_train_batch_size": PROMPTS * GENERATIONS,
                "num_generations": GENERATIONS, "max_completion_length": NEW_TOKENS, "logging_steps": 1,
                "save_strategy": "no", "learning_rate": 1e-6, **({"use_cpu": True} if smoke else {})}  # fmt: skip
    config = {
        "project_name": f"bench-vl-grpo-{model_dir.name}{'-vllm' if vllm else ''}",
        "model_name": str(model_dir),
        "training_type": "grpo",
        "dataset": {"path": str(data)},
        "rewards": [{"name": "length", "target_tokens": NEW_TOKENS}],
        "training_config": training,
    }
    import shutil

    shutil.rmtree(work / "outputs" / config["project_name"], ignore_errors=True)  # a fresh run, never a resume
    timing = Timing()
    summary = timed_run_config(config, work / "outputs", timing)
    return {**timing.summary(), "engine": summary.get("rollouts", {}).get("engine")}


def run_child(variant: str, key: str, args) -> dict:
    command = [sys.executable, __file__, "--child", variant, "--models", key, "--steps", str(args.steps),
               "--work", args.work, *(["--smoke"] if args.smoke else [])]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        },
    )
    (Path(args.work) / f"{variant}-{key}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        return {"error": (done.stderr or done.stdout)[-1500:]}
    return json.loads(found[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="450m,1.6b")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--work", default="/tmp/leap-vl-grpo-bench")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None)
    parser.add_argument("--engines", default="leap,trl", help="leap,trl and vllm (leap-finetune's GRPO on vLLM)")
    parser.add_argument("--smoke", action="store_true", help="CPU check of this script: the tiny model, 8 tokens")
    args = parser.parse_args()
    global NEW_TOKENS, PROMPTS, GENERATIONS
    if args.smoke:
        NEW_TOKENS, PROMPTS, GENERATIONS = 8, 2, 4
    work = Path(args.work)
    if args.child:
        key = args.models
        model_dir, data = work / f"lfm2-vl-{key}", work / "prompts.jsonl"
        try:
            if args.child == "trl":
                result = child_trl(model_dir, data, work, args.steps, args.smoke)
            else:
                result = child_leap(model_dir, data, work, args.steps, args.smoke, vllm=args.child == "vllm")
        except Exception as err:  # noqa: BLE001 - a variant that fails is a row of the table
            import traceback

            result = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:500] if str(err) else ''}"}
            print(traceback.format_exc()[-3000:], file=sys.stderr, flush=True)  # (the child's log: where it failed)
        print("RESULT " + json.dumps(result, default=str), flush=True)
        return
    from vl_sft_throughput import build_model

    work.mkdir(parents=True, exist_ok=True)
    make_prompts(work, PROMPTS * args.steps * 2, 64 if args.smoke else 512)
    table = []
    for key in ["tiny"] if args.smoke else args.models.split(","):
        build_model(key, work / f"lfm2-vl-{key}")
        engines = args.engines.split(",")
        leap, trl, vllm = (run_child(e, key, args) if e in engines else {} for e in ("leap", "trl", "vllm"))
        row = {
            "model": f"LFM2-VL-{key}",
            "leap_rollout_tok_s": leap.get("rollout_tokens_per_s"),
            "trl_rollout_tok_s": trl.get("rollout_tokens_per_s"),
            "peak_gib": leap.get("peak_gib"),
            "trl_peak_gib": trl.get("peak_gib"),
            "engine": leap.get("engine"),
            "errors": {k: v["error"] for k, v in (("leap", leap), ("trl", trl), ("vllm", vllm)) if "error" in v}
            or None,
        }
        if vllm:
            row.update(vllm_rollout_tok_s=vllm.get("rollout_tokens_per_s"), vllm_peak_gib=vllm.get("peak_gib"))
        if row["leap_rollout_tok_s"] and row["trl_rollout_tok_s"]:
            row["speedup"] = round(row["leap_rollout_tok_s"] / row["trl_rollout_tok_s"], 2)
        table.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(table, indent=1), encoding="utf-8")
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke)"
    print(f"| model | leap rollout tok/s | TRL rollout tok/s | x | peak GiB (leap / TRL) | {device}")
    for row in table:
        print(f"| {row['model']} | {row['leap_rollout_tok_s']} | {row['trl_rollout_tok_s']} | {row.get('speedup')} | "
              f"{row['peak_gib']} / {row['trl_peak_gib']} | {row['errors'] or ''}")  # fmt: skip


if __name__ == "__main__":
    main()
