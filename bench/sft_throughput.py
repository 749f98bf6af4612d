"""SFT throughput on a CUDA machine, through the real leap-finetune path, against TRL's defaults.

python bench/sft_throughput.py [--models 350m,1.2b] [--steps 40] [--variants default,...] [--record]

- Builds the LFM2-350M and LFM2-1.2B architectures with random weights (no download) and saves them
  with the bundled tokenizer, so `model_name` is a local folder, as for a user's checkpoint.
- Synthetic conversations with a realistic length spread (log-normal, 200-2048 tokens).
- Measures real (non-padding) tokens/s from the run's metrics.jsonl after warm-up, peak memory, and
  MFU against a bf16 matmul peak measured in the same run.
- FLOPs per token = 6 * N (all parameters; the tied embedding counted once, as the LM head matmul)
  + causal attention 6 * 2 * n_attention_layers * d_model * E[len^2] / (2 E[len]) (QK^T and AV,
  forward + backward, each document attending to itself only).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

ARCHS = {
    "350m": dict(
        hidden_size=1024,
        intermediate_size=6656,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        full_attn_idxs=[2, 5, 8, 10, 12, 14],
    ),
    "1.2b": dict(
        hidden_size=2048,
        intermediate_size=12288,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        full_attn_idxs=[2, 5, 8, 10, 12, 14],
    ),
}


def matmul_peak() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, iters = time.perf_counter(), 50
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * iters / (time.perf_counter() - start)


def lfm2_config(name: str) -> transformers.Lfm2Config:
    """The LFM2 architecture `name` (ARCHS) with LFM2's vocabulary size and special token ids (pad 0, bos 1, eos 7:
    the bundled tokenizer's too). Also the language model of bench/vl_sft_throughput.py's LFM2-VL models."""
    arch = dict(ARCHS[name])
    attn = arch.pop("full_attn_idxs")
    layer_types = ["full_attention" if i in attn else "conv" for i in range(arch["num_hidden_layers"])]
    config = transformers.Lfm2Config(
        vocab_size=65536,
        layer_types=layer_types,
        block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0,
        block_multiple_of=256,
        conv_L_cache=3,
        max_position_embeddings=128000,
        tie_word_embeddings=True,
        **arch,
    )
    config.pad_token_id, config.bos_token_id, config.eos_token_id = 0, 1, 7
    return config


def build_model(name: str, folder: Path):
    from leap_finetune.models.tiny import load_tiny_tokenizer

    config = lfm2_config(name)
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    from leap_finetune.models.lfm2_keys import add_original_lfm2_keys

    add_original_lfm2_keys(config)  # as LiquidAI's checkpoints: vLLM's LFM2 reads them
    torch.manual_seed(0)
    model = transformers.Lfm2ForCausalLM(config).to(torch.bfloat16)  # as LiquidAI ships its checkpoints
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    return n_params, config


def make_data(path: Path, rows: int, seed: int = 0) -> list[int]:
    """Conversations whose rendered lengths spread like chat data: log-normal, clipped to 200-2048."""
    from leap_finetune.models.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    words = [w for w in "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly mice".split()]
    per_word = len(tokenizer(" ".join(words * 10), add_special_tokens=False)["input_ids"]) / (len(words) * 10)
    rng = random.Random(seed)
    lengths, lines = [], []
    for _ in range(rows):
        target = int(min(2040, max(200, rng.lognormvariate(math.log(700), 0.6))))
        n_words = int(target / per_word)
        user = " ".join(rng.choice(words) for _ in range(n_words // 3))
        answer = " ".join(rng.choice(words) for _ in range(n_words - n_words // 3))
        lines.append(
            json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
        )
        lengths.append(target)
    path.write_text("\n".join(lines) + "\n")
    return lengths


def flops_per_token(n_params: int, config, lengths: list[int]) -> float:
    n_attn = sum(t == "full_attention" for t in config.layer_types)
    mean_context = sum(l * l for l in lengths) / (2 * sum(lengths))
    return 6 * n_params + 12 * n_attn * config.hidden_size * mean_context


def tokens_per_second(metrics_path: Path, warmup_steps: int) -> float:
    records = [json.loads(l) for l in metrics_path.read_text().splitlines()]
    speeds = [r["tokens_per_second"] for r in records if "tokens_per_second" in r and r["step"] > warmup_steps]
    return statistics.median(speeds) if speeds else float("nan")


def leap_run(label: str, model_dir: Path, data: Path, work: Path, steps: int, training: dict, patch=None) -> dict:
    config = {
        "project_name": f"bench-{label}",
        "model_name": str(model_dir),
        "training_type": "sft",
        "dataset": {"path": str(data)},
        "training_config": {
            "extends": "DEFAULT_SFT",
            "max_steps": steps,
            "per_device_train_batch_size": 8,
            "logging_steps": 5,
            "save_strategy": "no",
            "max_length": 2048,
            "learning_rate": 1e-5,
            **training,
        },
    }
    if "batch_tokens" in training:  # (the rows of a micro-batch are as many as fit)
        del config["training_config"]["per_device_train_batch_size"]
    undo = patch() if patch is not None else None
    try:
        return measured_leap_run(config, work)
    finally:
        if undo is not None:
            undo()


def measured_leap_run(config: dict, work: Path, warmup_steps: int = 10, callbacks: list | None = None) -> dict:
    """Trains `config` through the real path (api.run_config, as `leap-finetune run` does) and measures it: real
    tokens/s after `warmup_steps` from the run's metrics.jsonl, peak GPU memory, wall time, the first losses."""
    from leap_finetune.api import run_config

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    summary = run_config(config, outputs_root=work / "outputs", callbacks=callbacks)
    run_dir = Path(summary["run_dir"])
    losses = [json.loads(l).get("loss") for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "tokens_per_second": tokens_per_second(run_dir / "metrics.jsonl", warmup_steps=warmup_steps),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
        "wall_s": time.perf_counter() - start,
        "losses": [l for l in losses if l is not None][:4],
        "curve": [l for l in losses if l is not None],
    }


def trl_default_run(model_dir: Path, data: Path, work: Path, steps: int) -> dict:
    """TRL SFTTrainer with its defaults on the same rows (messages rendered by the model's template)."""
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from leap_finetune.recipes.callbacks import MetricsLog

    out = work / "trl-default"
    out.mkdir(parents=True, exist_ok=True)
    dataset = load_dataset("json", data_files=str(data), split="train")
    args = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        max_length=2048,
        learning_rate=1e-5,
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer = SFTTrainer(
        model=str(model_dir), args=args, train_dataset=dataset, callbacks=[MetricsLog(out / "metrics.jsonl")]
    )
    trainer.train()
    result = {
        "tokens_per_second": tokens_per_second(out / "metrics.jsonl", warmup_steps=10),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
        "wall_s": time.perf_counter() - start,
        "losses": [],
    }
    del trainer
    return result


BF16 = {"model_init_kwargs": {"dtype": "bfloat16"}}
OFF = {"padding_free": False, "compile_layers": False}


def trl_step_metrics():
    """Round one's step (2026-12-01): TRL's and the Trainer's per-step `.item()` reads and transformers' packed-mask
    check, instead of recipes/host_syncs.py and the flat-batch mask hook. Returns the undo."""
    from transformers import Trainer
    from trl import SFTTrainer

    from leap_finetune.models import varlen_attention
    from leap_finetune.recipes.host_syncs import DeviceSideMetrics

    saved = (
        DeviceSideMetrics.compute_loss,
        DeviceSideMetrics._track_num_input_tokens,
        varlen_attention._no_mask_for_flat_batches,
    )
    DeviceSideMetrics.compute_loss = SFTTrainer.compute_loss
    DeviceSideMetrics._track_num_input_tokens = Trainer._track_num_input_tokens
    varlen_attention._no_mask_for_flat_batches = lambda module, args, kwargs: (args, kwargs)

    def undo():
        DeviceSideMetrics.compute_loss, DeviceSideMetrics._track_num_input_tokens = saved[0], saved[1]
        varlen_attention._no_mask_for_flat_batches = saved[2]

    return undo


def torchao_stochastic_rounding():
    """optimizer_precision bf16_kahan's slot filled with torchao's AdamW with bf16 stochastic rounding (a private
    class, `_AdamW`: measured here as a lever, not offered as a key). Returns the undo."""
    from torchao.optim import _AdamW

    from leap_finetune.recipes import optimizers

    original = optimizers.optimizer_cls_and_kwargs

    def stochastic(precision, args):
        if precision != "bf16_kahan":
            return original(precision, args)
        betas = (args.adam_beta1, args.adam_beta2)
        return _AdamW, {
            "lr": args.learning_rate,
            "betas": betas,
            "eps": args.adam_epsilon,
            "weight_decay": args.weight_decay,
            "bf16_stochastic_round": True,
        }

    optimizers.optimizer_cls_and_kwargs = stochastic
    return lambda: setattr(optimizers, "optimizer_cls_and_kwargs", original)


def compiled_optimizer(mode: str | None = None):
    """The default's AdamW (float32 states) with its step compiled by torch.compile and the learning rate a tensor
        (PyTorch's recipe "compiled optimizer with an LR scheduler": the scheduler fills the tensor, no recompile per
        step). Inductor fuses the update of all parameters into a few kernels instead of fused AdamW's ~290
        multi_tensor_apply launches. mode "reduce-overhead" also captures the compiled update in a CUDA graph (one
    launch per step). Returns the undo."""
    import torch

    from leap_finetune.recipes import optimizers

    class CompiledAdamW(torch.optim.AdamW):
        def __init__(self, params, lr, **kwargs):
            super().__init__(params, lr=torch.tensor(lr), **kwargs)
            self._compiled_step = torch.compile(lambda: torch.optim.AdamW.step(self), fullgraph=False, mode=mode)

        def step(self, closure=None):
            assert closure is None
            return self._compiled_step()

    original = optimizers.optimizer_cls_and_kwargs

    def compiled(precision, args):
        if precision not in (None, "fp32"):
            return original(precision, args)
        betas = (args.adam_beta1, args.adam_beta2)
        return CompiledAdamW, {
            "lr": args.learning_rate,
            "betas": betas,
            "eps": args.adam_epsilon,
            "weight_decay": args.weight_decay,
        }

    optimizers.optimizer_cls_and_kwargs = compiled
    return lambda: setattr(optimizers, "optimizer_cls_and_kwargs", original)


ROUND_ONE = {
    "pad_to_multiple_of": None,
    "logging_nan_inf_filter": True,
    "dataloader_pin_memory": False,
    "accelerator_config": {"non_blocking": False},
}


def fp8_tensorwise():
    """precision fp8 with torchao's tensorwise scales (one per tensor, not per row). Returns the undo."""
    from leap_finetune.recipes import fp8

    saved, fp8.RECIPE = fp8.RECIPE, "tensorwise"

    def undo():
        fp8.RECIPE = saved

    return undo


def liger_layer_kernels():
    """Liger's RMSNorm and SwiGLU kernels (liger-kernel 0.8.5) in LFM2's norms and MLPs, used as functions: Liger has
    no LFM2 patch, and TRL 1.16 refuses its fused linear cross entropy (it replaces the fused LM head). Inside the
    compiled layers. Returns the undo."""
    import torch
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    from transformers.models.lfm2 import modeling_lfm2

    saved = (modeling_lfm2.Lfm2RMSNorm.forward, modeling_lfm2.Lfm2MLP.forward)

    def norm(self, hidden_states):
        # LFM2's norm: float32 statistics, cast back, then the weight (liger's "llama" casting mode)
        weight = self.weight.to(hidden_states.dtype) if torch.is_autocast_enabled() else self.weight
        return LigerRMSNormFunction.apply(hidden_states, weight, self.variance_epsilon, 0.0, "llama", False)

    def mlp(self, x):
        return self.w2(LigerSiLUMulFunction.apply(self.w1(x), self.w3(x)))

    modeling_lfm2.Lfm2RMSNorm.forward, modeling_lfm2.Lfm2MLP.forward = norm, mlp

    def undo():
        modeling_lfm2.Lfm2RMSNorm.forward, modeling_lfm2.Lfm2MLP.forward = saved

    return undo


VARIANTS = {
    # name: (label, training_config overrides on top of DEFAULT_SFT[, patch returning its undo])
    "default": ("leap default", {}),
    "round-one": ("round one's default (unpadded, host syncs)", ROUND_ONE, trl_step_metrics),
    "no-pad": ("default without pad_to_multiple_of", {"pad_to_multiple_of": None}),
    "pad8": ("default, pad_to_multiple_of 8", {"pad_to_multiple_of": 8}),
    "syncs": ("default with TRL's per-step host syncs", {"logging_nan_inf_filter": True}, trl_step_metrics),
    "foreach": ("default, AdamW foreach (not fused)", {"optim": "adamw_torch"}),
    "bf16-plain": ("bf16 weights, torch AdamW", BF16),
    "bf16-kahan": ("optimizer_precision bf16_kahan (torch-optimi)", {"optimizer_precision": "bf16_kahan"}),
    "bf16-sr": (
        "bf16 weights, torchao AdamW stochastic rounding",
        {"optimizer_precision": "bf16_kahan"},
        torchao_stochastic_rounding,
    ),
    "workers": (
        "default + 4 data-loader workers (persistent)",
        {"dataloader_num_workers": 4, "dataloader_persistent_workers": True},
    ),
    "no-workers": ("default without data-loader workers", {"dataloader_num_workers": 0}),
    "compiled-opt": ("default, AdamW step compiled (torch.compile, tensor lr)", {}, compiled_optimizer),
    "graph-opt": (
        "default, AdamW step compiled and captured in a CUDA graph (reduce-overhead)",
        {},
        functools.partial(compiled_optimizer, "reduce-overhead"),
    ),
    "fp8": ("precision fp8 (torchao float8, rowwise scales)", {"precision": "fp8"}),
    "fp8-tensorwise": ("precision fp8, tensorwise scales", {"precision": "fp8"}, fp8_tensorwise),
    "no-clip": ("default without gradient clipping (attribution only)", {"max_grad_norm": 0}),
    "liger": ("default with Liger's RMSNorm and SwiGLU kernels", {}, liger_layer_kernels),
    "padded": ("padded batches (the previous default)", OFF),
    "padding-free": ("padding-free + varlen attention", {"padding_free": True, "compile_layers": False}),
    "packing": ("packing (bfd) + varlen attention", {"packing": True, "compile_layers": False}),
    "packing-compile": ("packing + varlen + compiled layers", {"packing": True, "compile_layers": True}),
    "bf16-packing-compile": (
        "bf16 weights + fused AdamW + packing + varlen + compiled layers",
        {**BF16, "optim": "adamw_torch_fused", "packing": True, "compile_layers": True},
    ),
    "bf16": ("bf16 weights, padded", {**BF16, **OFF}),
    "default-batch16": ("leap default, batch 16", {"per_device_train_batch_size": 16}),
    # batch 8 of the bench's rows is ~6.5k tokens (mean 816): the same tokens per step in full micro-batches, and twice
    "tokens-6.5k": ("batch_tokens 6528 (batch 8's mean tokens)", {"batch_tokens": 6528}),
    "tokens-13k": ("batch_tokens 13056 (batch 16's mean tokens)", {"batch_tokens": 13056}),
}


def curve_table(curves: dict[str, list], every: int) -> list[str]:
    """Mean loss per window of `every` logged losses, one column per variant, and each column's largest distance
    from the first column over the last half of the run."""
    names = [n for n, c in curves.items() if c]
    if not names:
        return []
    windows = min(len(curves[n]) for n in names) // every
    means = {n: [statistics.mean(curves[n][i * every : (i + 1) * every]) for i in range(windows)] for n in names}
    lines = ["", f"Loss, mean of each {every} logged values:", "", "| window | " + " | ".join(names) + " |"]
    lines.append("| --- " * (len(names) + 1) + "|")
    for i in range(windows):
        lines.append(f"| {i + 1} | " + " | ".join(f"{means[n][i]:.4f}" for n in names) + " |")
    first = means[names[0]]
    half = windows // 2
    lines.append(
        "| max abs diff to the first column, second half | "
        + " | ".join(f"{max(abs(a - b) for a, b in zip(means[n][half:], first[half:])):.4f}" for n in names)
        + " |"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="350m,1.2b")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--curves", type=int, default=0, help="also print the mean loss of every N logged losses")
    parser.add_argument("--work", default="/tmp/leap-bench")
    parser.add_argument("--out", default=None, help="write the table so far to this file after every variant")
    parser.add_argument("--record", action="store_true", help="append the finished table to bench/RESULTS.md")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak()
    data = work / "chat.jsonl"
    lengths = make_data(data, rows=args.steps * 8 * 2)
    import trl

    lines = [
        f"### {datetime.date.today()} - {torch.cuda.get_device_name(0)} - torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        f"bf16 matmul peak measured in this run: {peak / 1e12:.0f} TFLOP/s. Rows: {len(lengths)}, "
        f"lengths {min(lengths)}-{max(lengths)} (mean {statistics.mean(lengths):.0f}); batch 8, max_length 2048.",
        "",
        "| model | path | real tokens/s | MFU | peak GiB | wall s | first losses |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in args.models.split(","):
        model_dir = work / f"lfm2-{name}"
        n_params, config = build_model(name, model_dir)
        per_token = flops_per_token(n_params, config, lengths)
        runs = {}
        if not args.skip_trl:
            runs["TRL SFTTrainer defaults"] = trl_default_run(model_dir, data, work / name, args.steps)

        def row(label: str, r: dict) -> str:
            if "error" in r:
                return f"| LFM2-{name} | {label} | failed: {r['error']} | | | | |"
            mfu = r["tokens_per_second"] * per_token / peak
            return (
                f"| LFM2-{name} ({n_params / 1e6:.0f}M) | {label} | {r['tokens_per_second']:,.0f} | {100 * mfu:.1f}% | "
                f"{r['peak_gib']:.1f} | {r['wall_s']:.0f} | {', '.join(f'{l:.3f}' for l in r['losses'])} |"
            )

        for label, r in runs.items():  # the TRL baseline, if measured
            lines.append(row(label, r))
        curves: dict[str, list] = {}
        for variant in args.variants.split(","):
            label, overrides, *patch = VARIANTS[variant]
            try:
                result = leap_run(f"{name}-{variant}", model_dir, data, work / name, args.steps, overrides, *patch)
            except Exception as err:  # noqa: BLE001 - record a failing lever and go on
                result = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
            gc.collect()
            torch.cuda.empty_cache()
            lines.append(row(label, result))
            curves[f"LFM2-{name} {label}"] = result.get("curve", [])
            if args.out:  # after every variant, so a run cut short still leaves its table
                Path(args.out).write_text("\n".join(lines) + "\n")
        if args.curves:
            lines += curve_table(curves, every=args.curves)
            if args.out:
                Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    if args.record:
        results = Path(__file__).with_name("RESULTS.md")
        results.write_text(results.read_text().rstrip() + "\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
