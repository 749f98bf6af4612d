"""Issue #47's peers at an emulated card (bench/memory.py --budgets ... --peer leap,trl,unsloth): TRL's SFTTrainer with
its defaults and Unsloth's recipe on the same rows as memory.py's budget_run, each row a dict of `{peer}_tok_s`,
`{peer}_fits`, `{peer}_peak_gib`. Unsloth runs in a process of its own (memory.py --child-unsloth): importing it patches
transformers, peft and TRL for the rest of the process."""

from __future__ import annotations

import gc
import json
import os
import shutil
from pathlib import Path

import torch

CHILD_ROW = "UNSLOTH_ROW "  # (--child-unsloth prints its row after this)


def emulate_card(budget: float) -> None:
    """This process held to `budget` GiB of the GPU (a card of that size), its peak statistics reset."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget * 2**30 / total))


def peer_run(peer: str, key: str, mode: str, budget: int, out: Path, steps: int, start, **config) -> dict:
    """A peer's row at the card of `budget` GiB emulated as in budget_run: `start(args)` builds its SFTTrainer from
    TRL's SFTConfig (batch 8 or --peer-rows, max_length 2048, `config`); loading the model counts. fits = no out-of-memory; real
    tokens/s after warm-up from the MetricsLog that `start` gives it (out/metrics.jsonl)."""
    import statistics

    from trl import SFTConfig

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rows = int(os.environ.get("LEAP_BENCH_PEER_ROWS", "8"))  # (--peer-rows; the child process inherits it)
    row = {"model": _models()[key], "method": "sft", "mode": mode, "budget_gib": budget, f"{peer}_rows": rows}
    emulate_card(budget)
    try:
        args = SFTConfig(
            output_dir=str(out),
            max_steps=steps,
            per_device_train_batch_size=rows,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            max_length=2048,
            learning_rate=2e-4 if mode in ("lora", "qlora") else 1e-5,
            include_num_input_tokens_seen="non_padding",
            disable_tqdm=True,
            **config,
        )
        trainer = start(args)
        trainer.train()
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        speeds = [m["tokens_per_second"] for m in metrics if "tokens_per_second" in m and m["step"] > 3]
        row.update({f"{peer}_fits": True, f"{peer}_tok_s": round(statistics.median(speeds)) if speeds else None})
        del trainer
    except Exception as err:  # noqa: BLE001 - an out-of-memory is the row's answer
        row.update({f"{peer}_fits": False, f"{peer}_tok_s": None, "why": f"{type(err).__name__}: {str(err)[:200]}"})
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        gc.collect()
    row[f"{peer}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def trl_adapter_options(mode: str) -> tuple:
    """TRL's side of a LoRA/QLoRA row: (peft LoraConfig or None, model_init_kwargs). LoRA takes DEFAULT_LORA's
    targets; QLoRA the nf4 weights with double quantization, as TRL's docs set it. Shared by every bench that runs
    TRL beside us (memory, moe_throughput)."""
    from peft import LoraConfig

    from leap_finetune.config import profiles

    init, peft = {}, None
    if mode in ("lora", "qlora"):
        lora = profiles.peft_profile("DEFAULT_LORA")
        lora.pop("use_peft")
        peft = LoraConfig(task_type="CAUSAL_LM", **lora)
    if mode == "qlora":
        from transformers import BitsAndBytesConfig

        init["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        init["device_map"] = {"": 0}
    return peft, init


def trl_budget_run(key: str, mode: str, budget: int, data: Path, work: Path, steps: int) -> dict:
    """TRL's SFTTrainer with its defaults (batch 8, gradient checkpointing, the model's bf16 weights, padding) on the
    same rows at the same emulated card: full, LoRA (DEFAULT_LORA's targets) or QLoRA (nf4, as TRL's docs set it)."""
    from datasets import load_dataset
    from trl import SFTTrainer

    from leap_finetune.recipes.callbacks import MetricsLog

    model = build_model(key, work / "models" / key)
    out = work / f"trl-{key}-{mode}-{budget}"
    peft, init = trl_adapter_options(mode)

    def start(args):
        dataset = load_dataset("json", data_files=str(data), split="train")
        callbacks = [MetricsLog(out / "metrics.jsonl")]
        return SFTTrainer(model=str(model), args=args, train_dataset=dataset, peft_config=peft, callbacks=callbacks)

    return peer_run("trl", key, mode, budget, out, steps, start, model_init_kwargs=init or None)


def unsloth_row(key: str, mode: str, budget: int, data: Path, work: Path, steps: int) -> dict:
    """unsloth_budget_run in a process of its own (`--child-unsloth`): importing unsloth patches transformers, peft
    and TRL for the rest of the process, and this process's leap and TRL rows must run them as they ship. The child's
    output goes to work/unsloth-KEY-MODE-BUDGET.log."""
    import subprocess
    import sys

    build_model(key, work / "models" / key)  # (built here, unpatched: the child only loads it)
    spec = json.dumps([key, mode, budget, str(data), str(work), steps])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "UNSLOTH_COMPILE_LOCATION": str(work / "unsloth_compiled_cache")}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "UNSLOTH_DISABLE_STATISTICS"):
        env.setdefault(name, "1")  # (local random models: the hub is never needed, and may not be reachable)
    command = [sys.executable, str(Path(__file__).resolve().parent / "memory.py"), "--child-unsloth", spec]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log = work / f"unsloth-{key}-{mode}-{budget}.log"
    log.write_text(done.stdout)
    found = [line[len(CHILD_ROW) :] for line in done.stdout.splitlines() if line.startswith(CHILD_ROW)]
    if found:
        return json.loads(found[-1])
    last = (done.stdout.strip().splitlines() or [""])[-1]  # (a traceback's last line)
    row = {"model": _models()[key], "method": "sft", "mode": mode, "budget_gib": budget, "unsloth_fits": False}
    why = f"child exited {done.returncode}: {last[:200]} (see {log})"
    return {**row, "unsloth_tok_s": None, "why": why, "unsloth_peak_gib": None}


def unsloth_budget_run(key: str, mode: str, budget: int, data: Path, work: Path, steps: int) -> dict:
    """Unsloth's recipe on the same rows at the same emulated card: FastLanguageModel (bf16; nf4 for qlora; full
    finetuning for full), its LoRA with DEFAULT_LORA's r, alpha and targets and use_gradient_checkpointing="unsloth",
    then TRL's SFTTrainer as Unsloth patches it. Only in a process of its own (unsloth_row): unsloth is imported
    before transformers, peft and TRL, and patches them."""
    from unsloth import FastLanguageModel

    # isort: split
    from datasets import load_dataset
    from trl import SFTTrainer

    from leap_finetune.config import profiles
    from leap_finetune.recipes.callbacks import MetricsLog

    out = work / f"unsloth-{key}-{mode}-{budget}"
    peft = mode in ("lora", "qlora")

    def start(args):
        model, tokenizer = FastLanguageModel.from_pretrained(
            str(work / "models" / key),
            max_seq_length=2048,
            load_in_4bit=mode == "qlora",
            dtype=torch.bfloat16,
            full_finetuning=not peft,
        )
        if peft:
            lora = profiles.peft_profile("DEFAULT_LORA")
            model = FastLanguageModel.get_peft_model(
                model,
                r=lora["r"],
                target_modules=lora["target_modules"],
                lora_alpha=lora["lora_alpha"],
                use_gradient_checkpointing="unsloth",
            )
        dataset = load_dataset("json", data_files=str(data), split="train")
        callbacks = [MetricsLog(out / "metrics.jsonl")]
        return SFTTrainer(
            model=model, processing_class=tokenizer, args=args, train_dataset=dataset, callbacks=callbacks
        )

    return peer_run("unsloth", key, mode, budget, out, steps, start)


def _models() -> dict:
    from memory import MODELS

    return MODELS


def build_model(key: str, folder: Path) -> Path:
    from memory import build_model as build  # (memory.py imports this module: at call time)

    return build(key, folder)
