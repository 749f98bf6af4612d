"""GRPO rollout speed on a CUDA machine with transformers' generation (use_vllm: false), against TRL's
defaults in the same run; with vLLM installed, also leap-finetune's vLLM colocate rollouts (the `leap_vllm*`
variants; bench/vllm_runs.py runs them with the environment vLLM needs on the lent machine).

python bench/grpo_rollout.py [--steps 6] [--arch 350m|1.2b] [--variants trl_default,leap_default,...] [--out FILE]
    [--record] [--profile]

- The LFM2-350M (or --arch 1.2b: LFM2-1.2B) architecture with random weights (no download), saved with the
  bundled tokenizer.
- 8 prompts x 8 generations per step, 256 new tokens (random weights rarely sample the end token, so
  nearly every completion is 256 tokens long); prompts of 20-150 tokens.
- Each variant runs in its own process (fresh CUDA context and compile caches): TRL's GRPOTrainer with
  its own defaults, and leap-finetune's GRPO through `run_config` (the CLI's path).
- Rollout tokens/s = completion tokens / seconds inside the trainer's generation call (CUDA-synchronised),
  median over the steps after the first two (warm-up, compilation); step time the same way. MFU of the
  rollout: 2 x parameters FLOPs per generated token against a bf16 matmul peak measured in the same run.
- `leap_default` is leap-finetune's sampler (rl/sampler.py); `leap_generate[_lora]` the path before it
  (transformers' generate with its compiled decoding step), forced in this script only. vLLM variants also record
  the median time of TRL's weight sync and of vLLM's generate per step.
- --profile: the rollout after the warm-up runs under torch.profiler; the row gives its GPU kernel time against
  its wall time (GPU-bound near 1) and the largest kernels (all of them in OUT.jsonl).
- Start-up: seconds from the variant's process start to its first training step (imports, data, model, and
  for vLLM the engine's start), and the trainer's construction alone (`init_s`: vLLM's engine starts there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

# when the process started (a parent that launches it passes its own clock: interpreter start and imports count)
LAUNCHED = float(os.environ.get("BENCH_LAUNCHED_AT") or time.time())

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

PROMPTS_PER_STEP, GENERATIONS, NEW_TOKENS = 8, 8, 256
WARMUP = 2

VARIANTS = {
    "trl_default": "TRL GRPOTrainer, its defaults (generate, dynamic cache, eager)",
    "trl_static": "TRL GRPOTrainer, cache_implementation: static (TRL turns compile off)",
    "trl_paged": "TRL GRPOTrainer, use_transformers_paged (continuous batching)",
    "leap_eager": "leap-finetune, cache_implementation: null (TRL's generate path)",
    "leap_generate": "leap-finetune, transformers' generate with its compiled decoding step (the default before "
    "rl/sampler.py)",
    "leap_default": "leap-finetune default (rl/sampler.py: static cache, the whole step in a CUDA graph)",
    "leap_default_lora": "leap-finetune default + LoRA (DEFAULT_LORA)",
    "leap_default_autotune": "leap-finetune default, the decoding step compiled with max-autotune (GEMMs tuned)",
    "leap_generate_lora": "leap-finetune + LoRA, transformers' generate with its compiled decoding step",
    # vLLM inside the training process (TRL's colocate mode; needs vLLM installed)
    "leap_vllm": "leap-finetune, vLLM colocate (use_vllm: true; TRL's vllm_gpu_memory_utilization 0.3)",
    "leap_vllm_mem05": "leap-finetune, vLLM colocate, vllm_gpu_memory_utilization: 0.5",
    "leap_vllm_mem015": "leap-finetune, vLLM colocate, vllm_gpu_memory_utilization: 0.15",
    "leap_vllm_sleep": "leap-finetune, vLLM colocate, vllm_enable_sleep_mode: true",
    "leap_vllm_lora": "leap-finetune, vLLM colocate + LoRA (DEFAULT_LORA)",
}
VLLM_SETTINGS = {
    "leap_vllm": {},
    "leap_vllm_mem05": {"vllm_gpu_memory_utilization": 0.5},
    "leap_vllm_mem015": {"vllm_gpu_memory_utilization": 0.15},
    "leap_vllm_sleep": {"vllm_enable_sleep_mode": True},
    "leap_vllm_lora": {},
}
DEFAULT_VARIANTS = "trl_default,trl_static,trl_paged,leap_eager,leap_default,leap_default_lora"
ARCH_NAMES = {"350m": "LFM2-350M", "1.2b": "LFM2-1.2B", "tiny": "tiny-lfm2"}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_prompts(path: Path, count: int, seed: int = 0) -> None:
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly mice".split()
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        n = rng.randint(12, 110)
        rows.append(
            {
                "prompt": f"Task {i}: continue this story. " + " ".join(rng.choice(words) for _ in range(n)),
                "solution": "x",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


class Timing:
    """Wraps a trainer class: times its construction, each generation call and each optimizer step
    (CUDA-synchronised). With `progress`, the summary so far is written there after every step (a run stopped
    at its time limit still says how far it got)."""

    def __init__(self, progress: str | Path | None = None):
        self.rollouts: list[tuple[float, int]] = []
        self.steps: list[float] = []
        self.init_s: float | None = None
        self.first_step_at: float | None = None  # seconds after LAUNCHED
        self.used_gib = 0.0
        self.progress = Path(progress) if progress else None
        self.extra: dict = {}  # more fields for the summary (a caller's own measurements)
        self.force_generate = False  # leap_generate: transformers' generate instead of rl/sampler.py
        self.profile_rollout: int | None = None  # profile this rollout (0-based) with torch.profiler
        self.vllm_split: dict[str, list[float]] = {"sync_weights": [], "vllm_generate": []}
        # --logp-gap: per rollout, the engine's sampling log-probabilities against the trainer's own for the same
        # tokens (one extra no-grad forward per step, outside the timed rollout; TRL's vLLM path logs the mean
        # absolute difference as sampling/sampling_logp_difference/mean - the same number here, for every engine)
        self.measure_gap = False
        self.gaps: list[dict] = []

    def wrap(self, trainer_cls):
        timing = self

        class Timed(trainer_cls):
            def __init__(self, *args, **kwargs):
                start = time.perf_counter()
                super().__init__(*args, **kwargs)
                timing.init_s = time.perf_counter() - start
                if timing.force_generate:  # the path every rollout took before rl/sampler.py
                    self.rollout_engine, self.rollout_why_not = "transformers generate", "bench: leap_generate"
                    self.generation_config.disable_compile = False
                if getattr(self, "vllm_generation", None) is not None:  # vLLM's time split: weight sync, generation
                    for name, key in (("sync_weights", "sync_weights"), ("generate", "vllm_generate")):
                        setattr(self.vllm_generation, name, timing.timed(getattr(self.vllm_generation, name), key))

            def _generate_single_turn(self, prompt_ids, *args, **kwargs):
                _sync()
                start = time.perf_counter()
                if len(timing.rollouts) == timing.profile_rollout:
                    with timing.profiler() as prof:
                        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
                        _sync()
                    wall = time.perf_counter() - start
                    timing.extra["profile"] = kernel_summary(prof, wall)
                else:
                    completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
                    _sync()
                timing.rollouts.append((time.perf_counter() - start, sum(len(c) for c in completion_ids)))
                return completion_ids, logprobs

            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                if timing.measure_gap and output.get("sampling_per_token_logps") is not None:
                    timing.gaps.append(logp_gap(self, output))
                return output

        return Timed

    def timed(self, method, key: str):
        def run(*args, **kwargs):
            _sync()
            start = time.perf_counter()
            result = method(*args, **kwargs)
            _sync()
            self.vllm_split[key].append(time.perf_counter() - start)
            return result

        return run

    @staticmethod
    def profiler():
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])

    def clock(self):
        from transformers import TrainerCallback

        timing = self

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                _sync()
                if timing.first_step_at is None:
                    timing.first_step_at = time.time() - LAUNCHED
                self.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                _sync()
                timing.steps.append(time.perf_counter() - self.start)
                timing.used_gib = max(timing.used_gib, gpu_used_gib())
                timing.write_progress()

        return StepClock()

    def write_progress(self) -> None:
        if self.progress is not None:
            self.progress.write_text(json.dumps(self.summary()))

    def summary(self) -> dict:
        rollouts = self.rollouts[WARMUP:]
        return {
            "rollout_tokens_per_s": statistics.median(t / s for s, t in rollouts) if rollouts else float("nan"),
            "rollout_s": statistics.median(s for s, _ in rollouts) if rollouts else float("nan"),
            "tokens_per_rollout": statistics.median(t for _, t in rollouts) if rollouts else 0,
            "step_s": statistics.median(self.steps[WARMUP:]) if self.steps[WARMUP:] else float("nan"),
            "first_rollout_s": self.rollouts[0][0] if self.rollouts else float("nan"),
            "first_step_s": self.steps[0] if self.steps else float("nan"),
            "startup_s": self.first_step_at if self.first_step_at is not None else float("nan"),
            "init_s": self.init_s if self.init_s is not None else float("nan"),
            "steps_done": len(self.steps),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
            # the whole GPU (vLLM's memory pool in sleep mode is not torch's allocator)
            "gpu_used_gib": self.used_gib,
            **{
                f"{key}_s": statistics.median(values[WARMUP:])
                for key, values in self.vllm_split.items()
                if values[WARMUP:]
            },
            **(
                {
                    "logp_gap": {
                        "rollouts": len(self.gaps),
                        **{key: statistics.median(g[key] for g in self.gaps) for key in ("mean_abs", "kl", "p99_abs")},
                        "max_abs": max(g["max_abs"] for g in self.gaps),
                        "per_rollout": self.gaps,
                    }
                }
                if self.gaps
                else {}
            ),
            **self.extra,
        }


def logp_gap(trainer, output: dict) -> dict:
    """How far the rollout engine's distribution is from the trainer's: for every completion token, the sampling
    log-probability (the engine's, after temperature/top-k/top-p) minus the trainer's own (its model, under its
    autocast, at the same weights, in eval mode). `kl`: the mean of that difference, an estimate of KL(engine || trainer) per
    token; `mean_abs` is TRL's sampling/sampling_logp_difference/mean."""
    prompt_completion = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    keep = output["completion_ids"].size(1)
    was_training = trainer.model.training
    trainer.model.eval()  # the policy's distribution: no dropout (DEFAULT_LORA's lora_dropout), as while sampling
    try:
        with torch.no_grad():
            trainer_logps, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, prompt_completion, mask, keep, batch_size=trainer.args.per_device_train_batch_size
            )[:2]
    finally:
        trainer.model.train(was_training)
    tokens = output["completion_mask"].bool()
    diff = (output["sampling_per_token_logps"] - trainer_logps)[
        tokens & ~torch.isnan(output["sampling_per_token_logps"])
    ]
    diff = diff.float()
    return {
        "tokens": int(diff.numel()),
        "mean_abs": diff.abs().mean().item(),
        "kl": diff.mean().item(),
        "p99_abs": diff.abs().quantile(0.99).item() if diff.numel() < 16_000_000 else float("nan"),
        "max_abs": diff.abs().max().item(),
    }


def kernel_summary(prof, wall_s: float, top: int = 6) -> dict:
    """GPU kernel time against the wall time of one profiled rollout: near 1, the GPU is the limit; far below, the
    host (Python, launches, syncs) is. The largest kernels by total time, and how many kernels ran."""

    def device_us(event) -> float:
        return getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0

    kernels = [e for e in prof.events() if getattr(e.device_type, "name", "") == "CUDA"]
    busy = sum(device_us(e) for e in kernels) / 1e6  # (microseconds)
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + device_us(e) / 1e6
    largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "wall_s": round(wall_s, 3),
        "gpu_kernel_s": round(busy, 3),
        "kernels": len(kernels),
        "gpu_share": round(busy / wall_s, 3) if wall_s else None,
        "top": [(name[:60], round(t, 4)) for name, t in largest],
    }


def gpu_used_gib() -> float:
    if not torch.cuda.is_available():
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def length_reward(completions, **kwargs):
    return [min(len(str(c)) / 1000, 1.0) for c in completions]


def child_trl(variant: str, model_dir: Path, data: Path, work: Path, steps: int) -> dict:
    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = load_dataset("json", data_files=str(data), split="train")
    dataset = dataset.map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"]}]})
    extra = {"trl_static": {"cache_implementation": "static"}, "trl_paged": {"use_transformers_paged": True}}.get(
        variant, {}
    )
    if not torch.cuda.is_available():  # --smoke
        extra.update(use_cpu=True, bf16=False)
    args = GRPOConfig(
        output_dir=str(work / variant),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=NEW_TOKENS,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_vllm=False,
        disable_tqdm=True,
        **extra,
    )
    timing = Timing()
    trainer = timing.wrap(GRPOTrainer)(
        model=str(model_dir), reward_funcs=length_reward, args=args, train_dataset=dataset, callbacks=[timing.clock()]
    )
    dtype = str(next(trainer.model.parameters()).dtype)
    trainer.train()
    return {**timing.summary(), "weights": dtype}


def timed_run_config(config: dict, outputs_root: Path, timing: Timing, callbacks: list | None = None) -> dict:
    """leap-finetune's run_config (the CLI's path) with its GRPO trainer class wrapped by `timing`."""
    import leap_finetune.recipes.grpo as grpo_recipe
    from leap_finetune.api import run_config

    original = grpo_recipe.trainer_class
    grpo_recipe.trainer_class = lambda: timing.wrap(original())
    try:
        return run_config(config, outputs_root=outputs_root, callbacks=[timing.clock(), *(callbacks or [])])
    finally:
        grpo_recipe.trainer_class = original


def child_leap(
    variant: str,
    model_dir: Path,
    data: Path,
    work: Path,
    steps: int,
    progress: str | None = None,
    profile: bool = False,
    gap: bool = False,
) -> dict:
    training = {
        "use_vllm": False,
        "max_steps": steps,
        "per_device_train_batch_size": PROMPTS_PER_STEP * GENERATIONS,
        "num_generations": GENERATIONS,
        "max_completion_length": NEW_TOKENS,
        "logging_steps": 1,
        "save_strategy": "no",
        "learning_rate": 1e-6,
    }
    if variant == "leap_eager":
        training["cache_implementation"] = None
    if variant in VLLM_SETTINGS:
        training.update(use_vllm=True, vllm_mode="colocate", **VLLM_SETTINGS[variant])
    config = {
        "project_name": f"bench-{variant}-{model_dir.name}",
        "model_name": str(model_dir),
        "training_type": "grpo",
        "dataset": {"path": str(data)},
        "rewards": [{"name": "length", "target_tokens": NEW_TOKENS}],
        "training_config": training,
    }
    if variant.endswith("_lora"):
        config["peft_config"] = {"extends": "DEFAULT_LORA"}
    import shutil

    shutil.rmtree(work / "outputs" / config["project_name"], ignore_errors=True)  # a fresh run, never a resume
    timing = Timing(progress)
    timing.force_generate = variant.startswith("leap_generate")
    timing.profile_rollout = WARMUP + 1 if profile else None
    timing.measure_gap = gap
    if variant == "leap_default_autotune":
        import leap_finetune.rl.sampler as sampler

        sampler.COMPILE_MODE = "max-autotune"
    summary = timed_run_config(config, work / "outputs", timing)
    run_dir = Path(summary["run_dir"])
    logged = [
        json.loads(line).get("rollout/tokens_per_s") for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    logged = [v for v in logged if v is not None][WARMUP:]
    return {
        **timing.summary(),
        "logged_rollout_tokens_per_s": statistics.median(logged) if logged else None,
        "engine": summary.get("rollouts", {}).get("engine"),
    }


def error_text(err: BaseException, lines: int = 3) -> str:
    """The error's type and its first lines (a LeapError with where and fix)."""
    from leap_finetune.errors import LeapError

    text = err.format() if isinstance(err, LeapError) else str(err)
    first = [line for line in text.splitlines() if line.strip()][:lines]
    return f"{type(err).__name__}: " + " / ".join(first)[:400]


def matmul_peak() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync()
    start, iters = time.perf_counter(), 50
    for _ in range(iters):
        a @ b
    _sync()
    return 2 * 8192**3 * iters / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of: {', '.join(VARIANTS)}")
    parser.add_argument("--arch", default="350m", choices=["350m", "1.2b"])
    parser.add_argument("--progress", default=None, help="(child) write the summary so far here after every step")
    parser.add_argument("--work", default="/tmp/leap-grpo-bench")
    parser.add_argument("--out", default=None, help="write the table so far to this file after every variant")
    parser.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    parser.add_argument("--child", default=None)
    parser.add_argument("--smoke", action="store_true", help="CPU check of this script: the tiny model, 8 tokens")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile one rollout per variant (the one after the warm-up): GPU kernel time vs wall",
    )
    parser.add_argument(
        "--logp-gap",
        action="store_true",
        help="per rollout: the engine's sampling log-probabilities against the trainer's (one extra "
        "forward per step, outside the timed rollout; step times then include it)",
    )
    args = parser.parse_args()
    global NEW_TOKENS
    arch = "tiny" if args.smoke else args.arch
    if args.smoke:
        NEW_TOKENS = 8
    work = Path(args.work)
    model_dir, data = work / f"lfm2-{arch}", work / "prompts.jsonl"
    if args.child:
        try:
            if args.child.startswith("trl"):
                result = child_trl(args.child, model_dir, data, work, args.steps)
            else:
                result = child_leap(
                    args.child, model_dir, data, work, args.steps, args.progress, args.profile, args.logp_gap
                )
        except Exception as err:  # noqa: BLE001 - a variant that fails is a row of the table
            result = {"error": error_text(err)}
        print("RESULT " + json.dumps(result), flush=True)
        return

    import transformers
    import trl
    from sft_throughput import build_model

    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

        tokenizer = load_tiny_tokenizer("tiny-lfm2")
        model = build_tiny_model("tiny-lfm2", tokenizer)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        n_params, peak = sum(p.numel() for p in model.parameters()), float("nan")
    else:
        n_params, _ = build_model(arch, model_dir)
        peak = matmul_peak()
    make_prompts(data, PROMPTS_PER_STEP * args.steps * 2)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke)"
    lines = [
        f"### {datetime.date.today()} - GRPO rollouts - {device} - torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"{ARCH_NAMES[arch]} architecture ({n_params / 1e6:.0f}M parameters, random weights, bf16 checkpoint); "
        f"{PROMPTS_PER_STEP} prompts x {GENERATIONS} generations per step, {NEW_TOKENS} new tokens, {args.steps} "
        f"steps, medians over steps {WARMUP + 1}-{args.steps}. bf16 matmul peak in this run: {peak / 1e12:.0f} TFLOP/s.",
        "",
        "| variant | rollout tokens/s | vs TRL default | rollout s | step s | first rollout s | MFU (rollout) | "
        "peak GiB | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = None
    for variant in args.variants.split(","):
        start = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--steps",
                str(args.steps),
                "--work",
                str(work),
                "--arch",
                args.arch,
                *(["--smoke"] if args.smoke else []),
                *(["--profile"] if args.profile else []),
                *(["--logp-gap"] if args.logp_gap else []),
            ],
            capture_output=True,
            text=True,
        )
        found = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        r = json.loads(found[-1][7:]) if found else {"error": f"exit {proc.returncode}: {proc.stderr[-300:]}"}
        wall = time.perf_counter() - start
        if args.out:  # every number the child measured (the table keeps the main ones)
            with Path(args.out + ".jsonl").open("a") as handle:
                handle.write(json.dumps({"variant": variant, "arch": arch, "wall_s": wall, **r}) + "\n")
        if "error" in r:
            lines.append(f"| {VARIANTS[variant]} | failed: {r['error']} | | | | | | | wall {wall:.0f} s |")
        else:
            speed = r["rollout_tokens_per_s"]
            base = speed if variant == "trl_default" else base
            ratio = f"{speed / base:.2f}x" if base else "-"
            notes = [f"wall {wall:.0f} s", f"start-up {r.get('startup_s', float('nan')):.0f} s"]
            if r.get("weights"):
                notes.append(f"weights {r['weights']}")
            if r.get("engine"):
                notes.append(f"engine: {r['engine']}")
            if r.get("sync_weights_s") is not None:
                notes.append(f"vLLM weight sync {r['sync_weights_s']:.2f} s + generate {r['vllm_generate_s']:.2f} s")
            if r.get("profile"):
                pr = r["profile"]
                notes.append(
                    f"profiled rollout: wall {pr['wall_s']:.2f} s, GPU kernels {pr['gpu_kernel_s']:.2f} s "
                    f"({pr['kernels']:,} kernels); largest: " + ", ".join(f"{n} {t:.3f} s" for n, t in pr["top"][:4])
                )
            if r.get("logp_gap"):
                g = r["logp_gap"]
                notes.append(
                    f"sampling vs trainer log-probs over {g['rollouts']} rollouts: mean |diff| "
                    f"{g['mean_abs']:.2e}, KL estimate {g['kl']:.2e}, p99 |diff| {g['p99_abs']:.2e}, max "
                    f"{g['max_abs']:.2e}"
                )
            if r.get("logged_rollout_tokens_per_s"):
                notes.append(f"logged rollout/tokens_per_s {r['logged_rollout_tokens_per_s']:,.0f}")
            lines.append(
                f"| {VARIANTS[variant]} | {speed:,.0f} | {ratio} | {r['rollout_s']:.2f} | {r['step_s']:.2f} | "
                f"{r['first_rollout_s']:.1f} | {100 * speed * 2 * n_params / peak:.2f}% | {r['peak_gib']:.1f} | "
                f"{'; '.join(notes)} |"
            )
        print(lines[-1], flush=True)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.record:
        with (ROOT / "bench" / "RESULTS.md").open("a") as handle:
            handle.write("\n" + table)


if __name__ == "__main__":
    main()
