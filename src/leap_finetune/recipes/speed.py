"""What SFT on a GPU uses when the user did not say: the fast settings that train the same tokens
with the same loss as the plain path, chosen per machine and model, and said in one log line.

Measured on the H200 (bench/RESULTS.md, bench/NOTES.md):
- padding-free batches (the batch's conversations flattened into one row, no padding tokens) with
  varlen flash attention and the boundary-aware convolution: the same conversations per step and the
  same loss as padded batches, 1.47x faster on LFM2-1.2B.
- torch.compile of each decoder layer (regional compilation): the layers repeat, so only two graphs
  (convolution block, attention block) are compiled, in seconds rather than minutes; the LM head and
  TRL's fused loss stay eager (compiling the whole model measured a loss of 0 on the H200).
- batches padded to a multiple of 8 tokens (`pad_to_multiple_of`): a padding-free batch is one row of
  any length, and LFM2's convolution blocks hand their input projection a gradient laid out with that
  length as its leading dimension; an odd length sends those GEMMs to slow pre-Hopper kernels
  (`cutlass_75 ... align1`, found by bench/profile_step.py --shapes). The padding tokens are documents
  of their own with no loss, so the loss and the real tokens counted (`num_input_tokens_seen`) are those
  of the unpadded batch (TRL's own `num_tokens` counts every position, as it does for padded batches).
- no host synchronisation inside a step (recipes/host_syncs.py; `logging_nan_inf_filter: false`, whose
  NaN check reads the loss every step) and inputs copied to the GPU without waiting (pinned memory,
  non-blocking copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leap_finetune.models.registry import VARLEN_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from leap_finetune.models.registry import model_type


def varlen_kernel_available() -> bool:
    """Whether this torch has varlen flash attention (torch.nn.attention.varlen, torch >= 2.10). Answered from the
    installed files when torch is not imported yet: `plan` and `validate` ask it for a GPU machine, and importing
    torch for it was ~2 s of their start-up there (measured with `plan --gpus 1`)."""
    import sys

    if "torch" not in sys.modules:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("torch")  # (locates the package without importing it)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        return any((Path(folder) / "nn" / "attention" / "varlen.py").is_file() for folder in folders)
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


# A multiple of 8 keeps the GEMMs aligned (16 bytes of bf16). Measured on LFM2-1.2B: 8 57.9k tokens/s, 64 56.3k, none 53.8k.
PAD_TO_MULTIPLE_OF = 8
# Batches collated (and, for sentence-transformers and images, tokenized / decoded) in worker processes beside the
# GPU's work instead of between steps. Measured on an H200: SFT LFM2-350M +11-14%, 1.2B +2.6%, the same losses;
# embedding +31%, ColBERT +23%; LFM2-VL-1.6B +35% (bench/RESULTS.md).
DATA_LOADER_WORKERS = 4


@dataclass(frozen=True)
class SpeedPlan:
    padding_free: bool
    compile_layers: bool
    line: str  # what was chosen, for the run log
    trainer_defaults: dict = field(default_factory=dict)  # Trainer arguments the user did not set


def plan(training: dict, model_id: str, cuda: bool, flat_batches: bool = True, lora: bool = False) -> SpeedPlan:
    """The user's `padding_free` / `compile_layers` win; unset ones are chosen here. `flat_batches`: whether the
    training type has padding-free batches (SFT); DPO and KTO get the compiled layers and the step settings.
    `lora`: LoRA with activation checkpointing leaves the layers uncompiled (measured on an H200, torch 2.11:
    inductor fails on the checkpointed LoRA layer - "Node ... was invalid, but is output")."""
    reason = None
    kind = model_type(model_id)
    if not cuda:
        reason = "CPU"
    elif kind not in SUPPORTED_MODEL_TYPES:
        reason = f"model type {kind or 'unknown'} (the fast path is verified for LFM2)"
    elif not varlen_kernel_available():
        reason = "no varlen flash attention in this torch (needs torch >= 2.10)"
    fast = reason is None
    packing = bool(training.get("packing")) and flat_batches
    padding_free = bool(training.get("padding_free", fast and not packing)) and flat_batches
    checkpointed_lora = lora and bool(
        training.get("activation_checkpointing") or training.get("gradient_checkpointing")
    )
    compile_layers = bool(training.get("compile_layers", fast and not checkpointed_lora))
    if packing:
        batches = "packing (bfd)"
    elif padding_free:
        batches = "padding-free batches"
    else:
        batches = "padded batches"
    chosen = [batches] + (["torch.compile per decoder layer"] if compile_layers else [])
    line = "speed: " + ", ".join(chosen)
    if reason is not None:
        unset = [key for key in ("padding_free", "compile_layers") if key not in training]
        given = [
            f"{key}: {str(training[key]).lower()}" for key in ("padding_free", "compile_layers") if key in training
        ]
        said = ([f"{' and '.join(unset)} off: {reason}"] if unset else []) + (
            [f"{', '.join(given)} as set"] if given else []
        )
        line += f" ({'; '.join(said)})"
    elif fast:
        line += (
            " (padding_free / compile_layers: false turn them off)"
            if flat_batches
            else " (compile_layers: false turns it off)"
        )
    if fast and checkpointed_lora and "compile_layers" not in training:
        line += "; compile_layers off: LoRA with activation checkpointing (inductor fails on it)"
    if not cuda and compile_layers and (padding_free or packing):
        # (no varlen kernel on a CPU: a compiled layer attends over the whole flat row with a block-diagonal mask)
        line += (
            "; note: on a CPU, compiling takes minutes and compiled layers attend over the whole flat row with a "
            "block mask (compile_layers: false is faster there)"
        )
    defaults = {}
    if (cuda and flat_batches) or padding_free or packing:
        defaults["pad_to_multiple_of"] = PAD_TO_MULTIPLE_OF
    if cuda:
        defaults["logging_nan_inf_filter"] = False  # its check reads the loss on the host every step
        defaults["dataloader_pin_memory"] = True
        defaults["dataloader_num_workers"] = DATA_LOADER_WORKERS
        defaults["accelerator_config"] = {"non_blocking": True}
    return SpeedPlan(padding_free, compile_layers, line, defaults)


def apply_trainer_defaults(args: dict, chosen: SpeedPlan) -> None:
    """The plan's Trainer arguments where the user set none (an accelerator_config of the user's is merged)."""
    for key, value in chosen.trainer_defaults.items():
        if key == "accelerator_config" and isinstance(args.get(key), dict):
            args[key] = {**value, **args[key]}
        else:
            args.setdefault(key, value)
    if args.get("dataloader_num_workers"):  # (torch refuses persistent workers without workers)
        args.setdefault("dataloader_persistent_workers", True)


def compile_cache_dir() -> str:
    """Where inductor keeps compiled kernels between runs: ~/.cache/leap-finetune/torchinductor unless the user set
    TORCHINDUCTOR_CACHE_DIR (torch's own default is under /tmp, which a reboot or a fresh container empties).
    Measured on the H200: LFM2-1.2B's 40-step run 62 s with a cold cache, 18 s with a warm one (bench/NOTES.md)."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    ours = os.path.join(os.path.expanduser("~"), ".cache", "leap-finetune", "torchinductor")
    # inductor reads the variable at every lookup, and writes its /tmp default into it on first use: that one is
    # replaced, a folder the user chose is kept
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = ours
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def compile_layers(model) -> int:
    """Compile each decoder layer in place (regional compilation); returns how many."""
    import torch._dynamo

    compile_cache_dir()
    layers = _decoder_layers(model)
    # All layers share one forward (Lfm2DecoderLayer's) but come in two kinds (convolution, attention),
    # and padding-free batches change length every step: a few graphs per kind. The default limit (8)
    # was measured to be hit on LFM2-1.2B, after which layers silently ran eagerly.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)
    for layer in layers:
        layer.compile(
            dynamic=True
        )  # lengths change every step: the dynamic graph at once, not after a first static one
    return len(layers)


def _decoder_layers(model):
    if isinstance(getattr(model, "layers", None), torch_module_list()):  # a backbone (sentence-transformers' encoder)
        return list(model.layers)
    inner = getattr(model, "model", None)
    inner = getattr(inner, "language_model", inner)  # a vision-language model: its language model's layers
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to compile")
    return list(layers)


def torch_module_list():
    import torch

    return torch.nn.ModuleList


def with_compile_phase(callbacks: list | None, console, compiled: bool) -> list:
    """The caller's callbacks, plus the compile phase's line when the layers are compiled."""
    return [*(callbacks or []), *([compile_phase(console)] if compiled else [])]


def compile_phase(console, steps_compiling: int = 3, steps_measured: int = 5):
    """A callback that shows torch.compile's cost as a phase of its own: a line when training starts (compilation
    happens in the first steps: the first shape, then the dynamic-shape graphs), and once the steps are steady,
    how long compiling took (the first steps' time beyond a steady step's) and where the cache is."""
    import time

    from transformers import TrainerCallback

    class CompilePhase(TrainerCallback):
        def __init__(self):
            self.durations: list[float] = []
            self.started = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                console.print(
                    f"compiling: torch.compile of the decoder layers runs during the first steps (~40 s for "
                    f"LFM2-1.2B on a fresh machine, seconds when cached; cache {compile_cache_dir()})"
                )

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if len(self.durations) >= steps_compiling + steps_measured:
                return
            self.durations.append(time.perf_counter() - self.started)
            if len(self.durations) == steps_compiling + steps_measured and state.is_world_process_zero:
                steady = sorted(self.durations[steps_compiling:])[steps_measured // 2]
                compiling = max(0.0, sum(self.durations[:steps_compiling]) - steps_compiling * steady)
                console.print(
                    f"compiled: ~{compiling:.0f} s of compilation in the first steps, then {steady:.2f} s/step"
                )

    return CompilePhase()
