"""Issue #52: distillation speed and memory, leap-finetune against TRL's GKDTrainer, same rows, same run.

    python bench/distill.py [--teacher 1.2b] [--student 350m] [--steps 30] [--modes offline,on_policy] [--served]
                            [--out distill.json]
    python bench/distill.py --smoke        # tiny-lfm2 into tiny-lfm2 on the CPU: checks the script, measures nothing

- The models: random bf16 weights of the published LFM2 architectures (bench/sft_throughput.py's builder) and the
  bundled tokenizer: a 1.2B teacher, a 350M student.
- The rows: bench/sft_throughput.py's conversations (200-2048 tokens, log-normal), 8 per step.
- leap-finetune: `training_type: distill`, offline, forward KL (its defaults: padding-free batches, compiled layers,
  the chunked divergence). TRL: `trl.experimental.gkd.GKDTrainer` with `lmbda: 0` (no on-policy generation: the
  dataset's answers, as offline distillation) and `beta: 0` (forward KL), its defaults otherwise.
- Tokens/s: real (non-padding) tokens per second after 5 warm-up steps, from each run's metrics.jsonl; peak memory:
  torch.cuda.max_memory_allocated of each run.
- `--modes on_policy`: a second row, the student sampling its answers each step (leap-finetune's sampler, 128 new
  tokens) against GKDTrainer with `lmbda: 1` (every batch on-policy, its generate); tokens/s counts the trained rows'
  real tokens as offline.
- `--served`: leap-finetune's offline run once more with the teacher served by leap-finetune's own server on the same
  GPU (`distill.teacher_base_url`, its top 20 log-probs per token): the cost of reading the teacher over HTTP against
  holding it in the training process (`leap_served_tok_s`, `leap_served_peak_gib`: the training process alone).
Row: {teacher, student, mode, leap_tok_s, trl_tok_s, leap_peak_gib, trl_peak_gib}.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import sys
from pathlib import Path

for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]  # (bench/ and the root)

import torch  # noqa: E402

NAMES = {"350m": "LFM2-350M", "1.2b": "LFM2-1.2B", "2.6b": "LFM2-2.6B"}


ON_POLICY_TOKENS = 128  # new tokens per sampled answer (--modes on_policy)


def leap(
    student: str, teacher: str, data: Path, work: Path, steps: int, smoke: bool, mode: str = "offline", url=None
) -> dict:
    from sft_throughput import measured_leap_run

    config = {
        "project_name": "distill-bench",
        "model_name": student,
        "training_type": "distill",
        "teacher": teacher,
        "dataset": {"path": str(data)},
        "training_config": {
            "extends": "DEFAULT_DISTILL",
            "max_steps": steps,
            "per_device_train_batch_size": 8,
            "logging_steps": 1 if smoke else 5,
            "save_strategy": "no",
            "eval_strategy": "no",
            "max_length": 2048,
            "learning_rate": 1e-5,
        },
    }
    if mode == "on_policy":
        config["distill"] = {"mode": "on_policy", "max_new_tokens": 8 if smoke else ON_POLICY_TOKENS}
    if url:
        config["distill"] = {**config.get("distill", {}), "teacher_base_url": url}
    result = measured_leap_run(config, work, warmup_steps=0 if smoke else 5)
    shutil.rmtree(work / "outputs", ignore_errors=True)
    return result


def trl(student: str, teacher: str, data: Path, work: Path, steps: int, smoke: bool, mode: str = "offline") -> dict:
    from datasets import load_dataset
    from sft_throughput import tokens_per_second
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from leap_finetune.recipes.callbacks import MetricsLog

    out = work / "trl-gkd"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    args = GKDConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        logging_steps=1 if smoke else 5,
        save_strategy="no",
        report_to="none",
        max_length=2048,
        learning_rate=1e-5,
        lmbda=1.0 if mode == "on_policy" else 0.0,  # (0: the dataset's answers only, offline distillation)
        max_new_tokens=8 if smoke else ON_POLICY_TOKENS,
        beta=0.0,  # (forward KL)
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
        bf16=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(),
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    tokenizer = AutoTokenizer.from_pretrained(student)
    trainer = GKDTrainer(
        model=AutoModelForCausalLM.from_pretrained(student, dtype=dtype),
        teacher_model=AutoModelForCausalLM.from_pretrained(teacher, dtype=dtype),
        args=args,
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        processing_class=tokenizer,
        callbacks=[MetricsLog(out / "metrics.jsonl")],
    )
    trainer.train()
    result = {
        "tokens_per_second": tokens_per_second(out / "metrics.jsonl", warmup_steps=0 if smoke else 5),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
    }
    del trainer
    return result


def models(args, work: Path) -> tuple[str, str]:
    if args.smoke:
        from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

        folders = [work / "models" / "tiny", work / "models" / "tiny-teacher"]  # (a model is not its own teacher)
        for folder in folders:
            if not (folder / "config.json").exists():
                tokenizer = load_tiny_tokenizer("tiny-lfm2")
                build_tiny_model("tiny-lfm2", tokenizer).save_pretrained(folder)
                tokenizer.save_pretrained(folder)
        return str(folders[0]), str(folders[1])
    from sft_throughput import build_model

    found = []
    for key in (args.student, args.teacher):
        folder = work / "models" / key
        if not (folder / "config.json").exists():
            build_model(key, folder)
        found.append(str(folder))
    return found[0], found[1]


def one_mode(mode: str, student: str, teacher: str, data: Path, work: Path, steps: int, args) -> dict:
    row = {"teacher": "tiny-lfm2" if args.smoke else NAMES[args.teacher], "mode": mode}
    row["student"] = "tiny-lfm2" if args.smoke else NAMES[args.student]
    sides = [("leap", lambda: leap(student, teacher, data, work, steps, args.smoke, mode))]
    sides.append(("trl", lambda: trl(student, teacher, data, work, steps, args.smoke, mode)))
    if args.served and mode == "offline":
        sides.append(("leap_served", lambda: served(student, teacher, data, work, steps, args.smoke)))
    for side, run in sides:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        try:
            found = run()
            row[f"{side}_tok_s"] = round(found["tokens_per_second"])
            row[f"{side}_peak_gib"] = round(found["peak_gib"], 2)
        except Exception as err:  # noqa: BLE001 - an out-of-memory or a failure is the row's answer
            row[f"{side}_tok_s"], row[f"{side}_peak_gib"] = None, None
            row[f"{side}_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    row["speedup"] = (
        round(row["leap_tok_s"] / row["trl_tok_s"], 2) if row.get("leap_tok_s") and row.get("trl_tok_s") else None
    )
    row["date"] = datetime.date.today().isoformat()
    row["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return row


def served(student: str, teacher: str, data: Path, work: Path, steps: int, smoke: bool) -> dict:
    """The offline run with the teacher behind leap-finetune's own server on this machine's GPU (or CPU)."""
    import subprocess
    import time
    import urllib.request

    port = 8391
    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = [sys.executable, "-m", "leap_finetune.evaluation.serve", teacher, "--port", str(port), "--device", device]
    with (work / "teacher-server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    if server.poll() is not None:
                        said = (work / "teacher-server.log").read_text(errors="replace")[-600:]
                        raise RuntimeError(f"the teacher server exited: {said}") from None
                    time.sleep(1)
            return leap(student, teacher, data, work, steps, smoke, url=f"http://127.0.0.1:{port}/v1")
        finally:
            server.terminate()
            server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--teacher", default="1.2b", choices=sorted(NAMES))
    parser.add_argument("--student", default="350m", choices=sorted(NAMES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--work", default="/tmp/leap-distill-bench")
    parser.add_argument("--out", default="distill-results.json")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--modes", default="offline", help="offline,on_policy")
    parser.add_argument("--served", action="store_true", help="offline once more with the teacher served")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    from sft_throughput import make_data

    data = work / "rows.jsonl"
    make_data(data, 24 if args.smoke else 8 * (args.steps + 2))
    student, teacher = models(args, work)
    steps = 3 if args.smoke else args.steps
    rows = [one_mode(mode, student, teacher, data, work, steps, args) for mode in args.modes.split(",")]
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
