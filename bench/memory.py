"""Issue #47: leap-finetune's predicted peak GPU memory against the measured one, per model, method, mode and length.

    python bench/memory.py [--cases sft,dpo,grpo,vl-sft] [--models 350m,1.2b,2.5-1.2b,2.6b] [--lengths 1024,2048]
                           [--vl-models 450m,1.6b] [--steps 4] [--out results.jsonl] [--smoke]
    python bench/memory.py --repredict bench/results/memory.json   # predicted_gib again, with today's estimator

Each case trains through the real path (`api.run_config`, in this process, one GPU) on rows that fill max_length
(so the padded micro-batch holds rows x max_length tokens), and records `torch.cuda.max_memory_allocated` beside
the prediction `plan` makes for the same config (memory/plan.py) with its parts. Models: random weights of the real
architectures (memory/shapes.py `published`, saved as bf16 folders with the bundled tokenizer, as
bench/sft_throughput.py does). `grpo`: LFM2's own sampler (use_vllm false), `--lengths` are max_completion_length;
`vl-sft`: LFM2-VL (bench/vl_sft_throughput.py's models and image rows), full / lora / qlora at each length. The
prediction is plan's, from the longest prepared row. `--smoke` runs the tiny model on the CPU (no peak: checks the
script).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")

import budget_peers  # noqa: E402  (bench/: TRL's and Unsloth's rows beside budget_run's)
import torch  # noqa: E402

MODELS = {
    "350m": "LFM2-350M",
    "1.2b": "LFM2-1.2B",
    "2.5-1.2b": "LFM2.5-1.2B",
    "2.6b": "LFM2-2.6B",
    "8b-a1b": "LFM2-8B-A1B",  # (a mixture of experts: issue #49's 24 GiB row)
}
VL_MODELS = {"450m": "LFM2-VL-450M", "1.6b": "LFM2-VL-1.6B"}
LORA = {"extends": "DEFAULT_LORA"}


def build_model(key: str, folder: Path) -> Path:
    """A folder of the published architecture with random bf16 weights and the bundled tokenizer."""
    return build_published(MODELS[key], folder)


def build_published(name: str, folder: Path) -> Path:
    """LiquidAI's published architecture `name` (memory/shapes.py: LFM2 or LFM2-MoE) with random bf16 weights,
    built on the GPU where there is one, and the bundled tokenizer (bench/moe_throughput.py uses it too)."""
    import transformers

    from leap_finetune.memory.shapes import published
    from leap_finetune.models.lfm2_keys import add_original_lfm2_keys
    from leap_finetune.models.tiny import load_tiny_tokenizer

    if (folder / "config.json").exists():
        return folder
    arch = dict(published(name))
    moe = arch.pop("model_type") == "lfm2_moe"
    config_class, model_class = (
        (transformers.Lfm2MoeConfig, transformers.Lfm2MoeForCausalLM)
        if moe
        else (transformers.Lfm2Config, transformers.Lfm2ForCausalLM)
    )
    config = config_class(**arch, max_position_embeddings=128000, tie_word_embeddings=True)
    config.pad_token_id, config.bos_token_id, config.eos_token_id = 0, 1, 7
    add_original_lfm2_keys(config)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    load_tiny_tokenizer("tiny-lfm2").save_pretrained(folder)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return folder


def vl_data(work: Path) -> Path:
    """bench/vl_sft_throughput.py's image rows (sizes and lengths as its workload), in the spec's format."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import vl_sft_throughput

    vl_sft_throughput.make_data(work / "vl", rows=64)
    return work / "vl" / "vl.jsonl"


def build_vl_model(key: str, folder: Path) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import vl_sft_throughput

    if not (folder / "config.json").exists():
        vl_sft_throughput.build_model(key, folder)
    return folder


def write_rows(path: Path, kind: str, rows: int = 64) -> Path:
    """Rows longer than any max_length measured (truncated to it): SFT conversations, DPO pairs."""
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly mice".split()
    text = " ".join(words * 80)  # (~3,400 tokens of the bundled tokenizer: more than max_length)
    lines = []
    for i in range(rows):
        if kind == "grpo":  # (the accuracy reward: the completion names the solution)
            lines.append({"prompt": f"Row {i}: {text[: 40 * (1 + i % 8)]} Name a color.", "solution": "teal"})
        elif kind == "dpo":
            lines.append({"prompt": f"Row {i}: say it.", "chosen": text, "rejected": " ".join(reversed(text.split()))})
        else:
            # (many short turns: truncation at max_length drops only the turn it cuts; the row is max_length long)
            turns = [
                [{"role": "user", "content": f"Row {i}, part {t}."}, {"role": "assistant", "content": text[:400]}]
                for t in range(40)
            ]
            lines.append({"messages": [m for turn in turns for m in turn]})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


PROFILES = {"sft": "DEFAULT_SFT", "dpo": "DEFAULT_DPO", "grpo": "DEFAULT_GRPO", "vl-sft": "DEFAULT_VLM_SFT"}


def case_config(model: str, method: str, mode: str, length: int, data: Path, steps: int) -> dict:
    training = {
        "extends": PROFILES[method],
        "max_steps": steps,
        "max_length": length,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "learning_rate": 1e-5,
    }
    if method == "grpo":  # (the own sampler; the length is the completions')
        training.update(use_vllm=False, max_completion_length=training.pop("max_length"))
    if mode == "checkpointing":
        training["activation_checkpointing"] = True
    config = {
        "project_name": f"mem-{method}-{mode}-{length}",
        "model_name": model,
        "training_type": "sft" if method == "vl-sft" else method,
        "dataset": {"path": str(data)},
        "training_config": training,
    }
    if method == "grpo":
        config["rewards"] = ["accuracy"]
    adapters = mode.removesuffix("-nodropout")  # (lora-nodropout, qlora-nodropout: lora_dropout 0, as Unsloth's)
    if adapters in ("lora", "qlora", "qlora-nocompile"):
        vl = "VLM_" if method == "vl-sft" else ""
        config["peft_config"] = {"extends": f"DEFAULT_{vl}{'LORA' if adapters == 'lora' else 'QLORA'}"}
        if adapters != mode:
            config["peft_config"]["lora_dropout"] = 0.0
    if mode == "qlora-nocompile":
        training["compile_layers"] = False
    return config


def predicted(config: dict, work: Path) -> dict:
    """What plan predicts for one training process of this config, from its longest prepared row."""
    from leap_finetune.launch.checks import prepare
    from leap_finetune.memory.plan import longest_row, predict, setup_of, shape_of
    from leap_finetune.validate.loader import load_config

    resolved = load_config(config, base_dir=work)
    _, _, prepared = prepare(resolved)
    longest = longest_row(prepared)
    shape = shape_of(resolved)
    memory = predict(resolved, shape, longest)
    setup = setup_of(resolved, shape, longest)
    return {**memory.to_json(), "tokens": setup.tokens, "logit_tokens": setup.logit_tokens, "longest_row": longest}


def repredict(path: Path) -> None:
    """predicted_gib of each row of a memory.json again, with the estimator as it is now, from the config the row
    ran (the published architecture's shape: no model is built; rows that fill max_length)."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (the tests' config of a measured row)
    from leap_finetune.memory.plan import training_process_memory
    from tests.memory.test_calibration import measured_resolved

    rows = json.loads(path.read_text())
    folder = Path(tempfile.mkdtemp())
    for row in rows:
        mode, _, rest = row["mode"].partition(" ")
        settings = {}
        if "bf16_kahan" in rest:
            settings["optimizer_precision"] = "bf16_kahan"
        if "bf16 base" in rest:
            settings["model_init_kwargs"] = {"dtype": "bfloat16"}
        if "checkpointing" in rest or mode == "checkpointing":
            settings["activation_checkpointing"] = True
        spec = {**row, "mode": mode.replace("-nocompile", ""), "settings": settings}
        memory = training_process_memory(measured_resolved(spec, folder))
        row["predicted_gib"] = round(memory.peak / 2**30, 2)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{path}: {len(rows)} rows predicted again")


def measure(config: dict, work: Path) -> dict:
    from leap_finetune.api import run_config

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    summary = run_config(config, outputs_root=work / "outputs")
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    reserved = torch.cuda.max_memory_reserved() / 2**30 if torch.cuda.is_available() else 0.0
    return {
        "measured_gib": round(peak, 2),
        "reserved_gib": round(reserved, 2),
        "wall_s": round(time.perf_counter() - start, 1),
        "steps": summary.get("global_step"),
    }


def budget_run(key: str, mode: str, budget: int, data: Path, work: Path, steps: int) -> dict:
    """A card of `budget` GiB emulated on the H200 (torch.cuda.set_per_process_memory_fraction): the run plans for
    it (gpu_memory:) and trains; fits = no out-of-memory; real tokens/s after warm-up from metrics.jsonl."""
    import statistics

    from leap_finetune.api import run_config

    model = str(build_model(key, work / "models" / key))
    config = case_config(model, "sft", mode, 2048, data, steps)
    config["gpu_memory"] = f"{budget}GiB"
    row = {"model": MODELS[key], "method": "sft", "mode": mode, "budget_gib": budget}
    budget_peers.emulate_card(budget)
    try:
        summary = run_config(config, outputs_root=work / "outputs")
        metrics = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        speeds = [m["tokens_per_second"] for m in metrics if "tokens_per_second" in m and m["step"] > 3]
        row.update(leap_fits=True, leap_tok_s=round(statistics.median(speeds)) if speeds else None)
    except Exception as err:  # noqa: BLE001 - an out-of-memory or a refusal is the row's answer
        row.update(leap_fits=False, leap_tok_s=None, why=f"{type(err).__name__}: {str(err)[:200]}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        shutil.rmtree(work / "outputs", ignore_errors=True)
    row["measured_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def cases(args) -> list[tuple[str, str, str, int]]:
    """(model key, method, mode, max_length)."""
    found = []
    for method in args.cases.split(","):
        modes = (
            ("full", "lora")
            if method in ("dpo", "grpo")
            else ("full", "lora", "qlora")
            if method == "vl-sft"
            else (tuple(args.modes.split(",")) if args.modes else ("full", "lora", "checkpointing"))
        )
        keys = args.vl_models.split(",") if method == "vl-sft" else args.models.split(",")
        for key in keys:
            for length in map(int, args.lengths.split(",")):
                for mode in modes:
                    if mode == "checkpointing" and (key != "1.2b" or length != max(map(int, args.lengths.split(",")))):
                        continue
                    if method in ("dpo", "grpo") and (
                        key != "1.2b" or length != min(map(int, args.lengths.split(",")))
                    ):
                        continue
                    found.append((key, method, mode, length))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="sft,dpo")  # (--modes picks SFT's modes: full,lora,checkpointing,qlora)
    parser.add_argument("--models", default="350m,1.2b,2.6b")
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--work", default="/tmp/leap-memory-bench")
    parser.add_argument("--out", default="memory-results.jsonl")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--budgets", default="", help="e.g. 16,24: SFT full and LoRA planned for these cards")
    parser.add_argument(
        "--modes",
        default="",
        help="full, lora, checkpointing, qlora, qlora-nocompile, lora-nodropout, qlora-nodropout (default: "
        "full,lora[,checkpointing])",
    )
    parser.add_argument(
        "--peer",
        default="leap",
        help="with --budgets, comma-separated: leap (this project), trl (its defaults), unsloth (its recipe, in a "
        "process of its own)",
    )
    parser.add_argument("--peer-rows", type=int, default=8, help="rows per step of the TRL and Unsloth rows")
    parser.add_argument("--child-unsloth", default="", help=argparse.SUPPRESS)  # (unsloth_row's child process)
    parser.add_argument("--vl-models", default="450m,1.6b", help="vl-sft's models (bench/vl_sft_throughput.py)")
    parser.add_argument("--repredict", default="", help="a memory.json: predicted_gib again with today's estimator")
    args = parser.parse_args()
    os.environ.setdefault("LEAP_BENCH_PEER_ROWS", str(args.peer_rows))
    if args.child_unsloth:  # (before anything imports transformers: unsloth must come first)
        key, mode, budget, data, work, steps = json.loads(args.child_unsloth)
        row = budget_peers.unsloth_budget_run(key, mode, budget, Path(data), Path(work), steps)
        return print(budget_peers.CHILD_ROW + json.dumps(row), flush=True)
    if args.repredict:
        return repredict(Path(args.repredict))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = {kind: write_rows(work / f"{kind}.jsonl", kind) for kind in ("sft", "dpo", "grpo")}
    if "vl-sft" in args.cases:
        data["vl-sft"] = vl_data(work)
    out = Path(args.out)
    if args.budgets:
        for key in args.models.split(","):
            for mode in (args.modes or "full,lora").split(","):
                for budget in map(int, args.budgets.split(",")):
                    for peer in args.peer.split(","):  # (leap,trl,unsloth: side by side, in the same run)
                        run = {"trl": budget_peers.trl_budget_run, "unsloth": budget_peers.unsloth_row}.get(
                            peer, budget_run
                        )
                        row = run(key, mode, budget, data["sft"], work, args.steps)
                        print(json.dumps(row), flush=True)
                        with out.open("a") as handle:
                            handle.write(json.dumps(row) + "\n")
        return
    smoke = [
        ("tiny", method, "full", {"grpo": 16, "vl-sft": 1024}.get(method, 256)) for method in args.cases.split(",")
    ]
    for key, method, mode, length in cases(args) if not args.smoke else smoke:
        if args.smoke and method != "vl-sft":
            model = "tiny-lfm2"
        elif method == "vl-sft":
            model = str(build_vl_model(key, work / "models" / f"vl-{key}"))
        else:
            model = str(build_model(key, work / "models" / key))
        config = case_config(model, method, mode, length, data[method], args.steps)
        name = VL_MODELS.get(key, key) if method == "vl-sft" else MODELS.get(key, key)
        row = {"model": name, "method": method, "mode": mode, "max_length": length}
        try:
            row.update(predicted(config, work))
            row.update(measure(config, work))
            shutil.rmtree(work / "outputs", ignore_errors=True)  # (a 2.6B run's saved model is 10 GB: the disk)
        except Exception as err:  # noqa: BLE001 - a case that fails is a row that says why
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        print(json.dumps(row), flush=True)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
