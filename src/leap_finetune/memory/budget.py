"""A GPU memory budget, and the defaults that fit a run into it.

The budget is the memory one GPU has for a training process: `--gpu-memory 24GiB` on plan / validate / run (a card
you are not on), else the free memory of the GPU a run trains on. When the predicted peak (memory/plan.py) is over
it, the defaults change, in this order, until it fits - the fastest setting that fits, since each step costs speed:

0. on every GPU run, fitting or not: LoRA's frozen base in bf16 (it costs neither speed nor accuracy);
1. bf16 weights, which cost no speed: a full fine-tune's weights and AdamW states in bf16 with Kahan summation
   (optimizer_precision: bf16_kahan, torch-optimi);
2. a smaller micro-batch while it still holds CHEAP_MICRO_BATCH_TOKENS (plan.py's count: a pair twice), gradient
   accumulation raised to keep the global batch: ~10% per halving (smaller GEMMs);
3. activation checkpointing (~10-30% slower for a full fine-tune; the activations shrink to each layer's input);
   with LoRA it also turns compile_layers off (inductor fails on the two together): measured 2.7x slower on
   LFM2-1.2B (bench/RESULTS.md 2026-12-07), which is why the cheap halvings come first;
4. smaller micro-batches below that size;
5. 8-bit AdamW states (bitsandbytes; only where it is installed and the optimizer is the default).

Once it fits, micro-batches halved before checkpointing are grown back while it still fits (checkpointing may have
made them unneeded).

A key the user set (in training_config or with --set) is never changed. When nothing fits, the error says so
before a model loads and names what would fit (LoRA and QLoRA, each with its predicted peak).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from leap_finetune.errors import LeapError
from leap_finetune.memory.estimate import GIB, Memory
from leap_finetune.memory.pictures import RowTiles, row_tiles
from leap_finetune.memory.plan import longest_row, micro_batch_tokens, predict, predicted_for, shape_of
from leap_finetune.methods import method_of

UNITS = {"gib": GIB, "gb": 10**9, "g": GIB, "mib": 2**20, "mb": 10**6, "": GIB}
# What the prediction (torch's allocated peak) must leave of the budget: CUDA's own context (~0.5-1 GiB, never
# counted as allocated) and the caching allocator's reserved-but-free blocks (measured 0.1-1.1 GiB over the peak,
# bench/memory.py's reserved_gib).
CONTEXT_BYTES = GIB
ALLOCATOR_SHARE = 0.05
# Halving the micro-batch down to this many tokens (rows x the longest row) costs less than activation
# checkpointing: LFM2-1.2B full fine-tune, 13k -> 6.5k tokens per micro-batch ~11% (bench/NOTES.md, #30), where
# checkpointing recomputes the forward (~25%) and, with LoRA, turns compile_layers off (2.7x, 2026-12-07).
CHEAP_MICRO_BATCH_TOKENS = 4096


def usable_bytes(budget: int) -> float:
    return max(0.0, budget * (1 - ALLOCATOR_SHARE) - CONTEXT_BYTES)


LARGEST_GIB = 1024  # (one GPU's memory: the largest cards hold 288 GB; a budget above this is a typo)
SMALLEST_GIB = 1  # (below this no GPU trains: CONTEXT_BYTES and the allocator's share are kept aside first)


def parse_budget(text, where: str = "--gpu-memory", key: str = "gpu_memory") -> int:
    """Bytes of `24GiB`, `24GB`, `24 G`, `24` (GiB), `16384MiB`: one GPU's memory, enough to train in."""
    found = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = found.group(2).lower() if found else None
    units = "GiB, GB, MiB or MB (a number alone is GiB)"
    if isinstance(text, bool) or not found:
        problem = "expected an amount of memory"
    elif unit not in UNITS:
        problem = f"'{found.group(2)}' is not a unit leap-finetune reads: {units}"
    elif float(found.group(1)) <= 0:
        problem = "expected more than 0"
    else:
        value = int(float(found.group(1)) * UNITS[unit])
        # (a budget too small for this model is refused by the fit, naming LoRA/QLoRA; one below any GPU's memory
        # is a unit slip, `24MB` for `24GB`, and every figure the fit printed for it read 0.0 GiB)
        if SMALLEST_GIB * GIB <= value <= LARGEST_GIB * GIB:
            return value
        if value > LARGEST_GIB * GIB:
            problem = f"{value / GIB:,.0f} GiB is more than any GPU holds: the budget is one GPU's memory"
        else:
            meant = float(found.group(1)) * UNITS[unit.replace("m", "g")] if unit in ("mb", "mib") else 0
            mib = int(value / 2**20 * 100) / 100  # (rounded down: 1023.999 MiB is not "1,024 MiB, less than 1 GiB")
            problem = (
                f"{mib:,.2f} MiB is less than any GPU that trains holds (CUDA's context and the allocator's slack "
                f"alone take about 1 GiB); the budget is one GPU's memory, at least {SMALLEST_GIB} GiB"
                + (
                    f" - did you mean {found.group(1)}G{found.group(2)[1:]}?"
                    if SMALLEST_GIB * GIB <= meant <= LARGEST_GIB * GIB
                    else ""
                )
            )
    raise LeapError(f"{key} is {text!r}: {problem}", where=where, fix=f"one GPU's memory in {units}, e.g. 24GiB, 80GB")


@dataclass(frozen=True)
class Change:
    key: str
    value: object
    reason: str
    peak: float  # the predicted peak after this change, bytes


@dataclass
class Fitted:
    budget: int
    memory: Memory  # the prediction with the changes applied
    changes: list[Change] = field(default_factory=list)
    training: dict = field(default_factory=dict)  # training_config with the changes
    tiles: RowTiles | None = None  # the pictures per row it was fitted with (memory/pictures.py)

    @property
    def fits(self) -> bool:
        return self.memory.peak <= usable_bytes(self.budget)


def fit_to_budget(resolved, budget: int, longest: int | None = None, tiles: RowTiles | None = None) -> Fitted | None:
    """The run's settings changed (where the user did not set them) to fit `budget`; None without a shape."""
    shape = shape_of(resolved) if predicted_for(resolved) else None
    if shape is None:
        return None
    training = dict(resolved.training)
    user = set(resolved.user_training_keys)
    usable = usable_bytes(budget)

    def predicted(t: dict) -> Memory:
        return predict(resolved.model_copy(update={"training": t}), shape, longest, budget, tiles)

    memory, changes = predicted(training), []
    for key, value, reason in _free_levers(training, user, resolved.peft is not None):  # (taken at any budget)
        training = {**training, **value}
        memory = predicted(training)
        changes.append(Change(key, value, reason, memory.peak))
    levers = [
        *_rollout_levers(resolved, user, shape, longest, budget),
        *_levers(training, user, method_of(resolved), lora=resolved.peft is not None, longest=longest),
    ]
    for key, value, reason in levers:
        if memory.peak <= usable:
            break
        trial = {**training, **value} if isinstance(value, dict) else {**training, key: value}
        after = predicted(trial)
        if after.peak < memory.peak:
            training, memory = trial, after
            changes.append(Change(key, value, reason, after.peak))
    if memory.peak <= usable:
        training, memory, changes = _grow_back(resolved.training, training, memory, changes, predicted, usable)
    return Fitted(budget, memory, changes, training, tiles)


def change_text(key: str, value) -> str:
    """`key -> value`, or for several keys changed together `key -> value, key -> value`."""
    if not isinstance(value, dict):
        return f"{key} -> {value}"
    return ", ".join(f"{k} -> {v}" for k, v in value.items())


def _replayed(changes: list[Change], original: dict, predicted) -> list[Change]:
    """The kept changes with the peak each gives when applied in order to the original settings (what plan prints
    beside each change: a peak computed with a halving since undone would be too low)."""
    training, replayed = dict(original), []
    for change in changes:
        value = change.value if isinstance(change.value, dict) else {change.key: change.value}
        training = {**training, **value}
        replayed.append(replace(change, peak=predicted(training).peak))
    return replayed


def _grow_back(original: dict, training: dict, memory: Memory, changes: list[Change], predicted, usable: float):
    """The fit with as few micro-batch halvings as still fit: a halving tried before checkpointing (cheap, but not
    free) is undone where checkpointing alone made room."""
    halvings = [c for c in changes if c.key == "per_device_train_batch_size"]
    for keep in range(len(halvings)):  # (fewest halvings first)
        kept = halvings[:keep]
        batch = kept[-1].value if kept else {k: original.get(k) for k in halvings[0].value}
        trial = {k: v for k, v in {**training, **batch}.items() if v is not None}  # (a key the original lacked)
        after = predicted(trial)
        if after.peak <= usable:
            dropped = {id(c) for c in halvings[keep:]}
            return trial, after, _replayed([c for c in changes if id(c) not in dropped], original, predicted)
    return training, memory, changes


def _rollout_levers(resolved, user: set[str], shape, longest: int | None, budget: int):
    """Colocated vLLM's share of the GPU (TRL's default 0.3) down to what its weights and one generation batch's KV
    cache need: it costs no speed while the batch fits in it, so it goes first."""
    from leap_finetune.memory.servers import generation_rows, rollout_length, smallest_vllm_share

    t = resolved.training
    colocated = t.get("use_vllm") and t.get("vllm_mode", "colocate") == "colocate"
    if not method_of(resolved).rewards or not colocated or "vllm_gpu_memory_utilization" in user:
        return
    share = smallest_vllm_share(resolved, shape, longest, budget)
    if share < float(t.get("vllm_gpu_memory_utilization", 0.3)):
        rows, length = generation_rows(t), rollout_length(t, longest)
        yield (
            "vllm_gpu_memory_utilization",
            share,
            f"colocated vLLM's share of the GPU: its bf16 weights, one generation batch's KV cache ({rows} x "
            f"{length} tokens) and 1 GiB of headroom",
        )


def _levers(training: dict, user: set[str], method, lora: bool = False, longest: int | None = None):
    """(key, value or {key: value, ...}, reason) in the order they are tried. KTO keeps 2 rows per micro-batch (its
    KL estimate pairs rows); GRPO's batch is its completions (num_generations divides it): left as it is."""
    yield from _precision_levers(training, user, lora, method)
    halvings = list(_halvings(training, user, method))
    cheap = [
        h for h in halvings if micro_batch_tokens({**training, **h[1]}, method, longest) >= CHEAP_MICRO_BATCH_TOKENS
    ]
    yield from cheap
    if "activation_checkpointing" not in user and "gradient_checkpointing" not in user:
        if not training.get("activation_checkpointing"):
            yield "activation_checkpointing", True, "keeps only each layer's input for the backward"
    yield from halvings[len(cheap) :]
    if "optim" not in user and "optimizer_precision" not in user and _has_bitsandbytes():
        yield "optim", "adamw_8bit", "AdamW's two moments in 8 bits (bitsandbytes)"


def _halvings(training: dict, user: set[str], method):
    """The micro-batch halved down to one row (two for KTO), gradient accumulation doubled each time."""
    rows = int(training.get("per_device_train_batch_size") or 1)
    fewest = 2 if method.kl_pairs else 1
    batch_keys = {"per_device_train_batch_size", "gradient_accumulation_steps"}
    if training.get("batch_tokens") or method.rewards or batch_keys & user:
        return
    accumulation = int(training.get("gradient_accumulation_steps") or 1)
    while rows // 2 >= fewest:
        rows //= 2
        accumulation *= 2
        yield (
            "per_device_train_batch_size",
            {"per_device_train_batch_size": rows, "gradient_accumulation_steps": accumulation},
            f"{rows} row(s) per micro-batch, gradient_accumulation_steps {accumulation}: the same global batch",
        )


def _free_levers(training: dict, user: set[str], lora: bool):
    """What costs neither speed nor accuracy, so it is taken on every GPU run, fitting or not: a LoRA run's frozen
    base in bf16 (model_init_kwargs dtype bfloat16). Under bf16 autocast its matmuls read bf16 copies of float32
    weights anyway (LFM2's published weights are bf16: the float32 copy holds the same values), so the copy only costs
    memory and the casts' time (LFM2-8B-A1B LoRA over a float32 base on an H100: 6.0k tokens/s at 65 GiB, where QLoRA
    over its bf16 experts ran 28.9k at 28.5 GiB; bench/RESULTS.md 2026-12-07). The adapters stay float32."""
    from leap_finetune.config.precision import init_dtype

    if not lora or init_dtype(training) is not None or "model_init_kwargs" in user or training.get("fp16"):
        return
    if training.get("train_vision_encoder") or training.get("train_projector"):
        return  # (LFM2-VL parts trained in full beside the adapters: their weights stay float32)
    init = {**(training.get("model_init_kwargs") or {}), "dtype": "bfloat16"}
    yield "model_init_kwargs", {"model_init_kwargs": init}, "the frozen base in bf16 (the adapters stay float32)"


def _precision_levers(training: dict, user: set[str], lora: bool, method):
    """A full fine-tune's weights and AdamW states in bf16 with Kahan summation (optimizer_precision: bf16_kahan, the
    float32 loss curve: needs torch-optimi), which costs no speed (docs/speed.md), before anything that does."""
    from leap_finetune.config.precision import COMPATIBLE_OPTIM, init_dtype, missing_package

    if init_dtype(training) is not None or "model_init_kwargs" in user or training.get("fp16") or lora:
        return  # (LoRA's frozen base: _free_levers)
    from leap_finetune.config.own_keys import keys_of

    if "optimizer_precision" not in keys_of(method):  # (sft, dpo, kto: GRPO's and the encoders' trainers refuse it)
        return
    if "optimizer_precision" in user or training.get("optimizer_precision") or missing_package("bf16_kahan"):
        return
    if "optim" in user and training.get("optim") not in COMPATIBLE_OPTIM:
        return
    yield "optimizer_precision", "bf16_kahan", "bf16 weights and AdamW states with Kahan summation (torch-optimi)"


def _has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def alternatives(
    resolved, budget: int, longest: int | None = None, tiles: RowTiles | None = None
) -> list[tuple[str, Memory]]:
    """What the error names when a run cannot fit: LoRA (for a full fine-tune) and QLoRA (unless the base is already
    quantized), each with the same fitting, as (how to ask for it, its predicted memory)."""
    if shape_of(resolved) is None:
        return []
    from leap_finetune.config import profiles
    from leap_finetune.config.quantization import QUANTIZATIONS, VISION_SKIPS, is_quantized

    init = resolved.training.get("model_init_kwargs") or {}
    if is_quantized(init):
        return []
    lora = profiles.peft_profile("DEFAULT_VLM_LORA" if resolved.vision else "DEFAULT_LORA")
    lora.pop("use_peft", None)
    nf4 = {**QUANTIZATIONS["nf4"], **({"llm_int8_skip_modules": VISION_SKIPS} if resolved.vision else {})}
    qlora_init = {"dtype": "bfloat16", **init, "quantization_config": nf4}
    choices = [] if resolved.peft is not None else [("LoRA (peft_config: {extends: DEFAULT_LORA})", {})]
    choices.append(("QLoRA (peft_config: {extends: DEFAULT_QLORA})", {"model_init_kwargs": qlora_init}))
    # (a full fine-tune's training trains the vision encoder; LoRA's defaults leave it frozen: validate/vision.py)
    trains = dict(profiles.VLM_LORA_TRAINS) if resolved.vision and resolved.peft is None else {}
    found = []
    for name, training in choices:
        changed = resolved.model_copy(
            update={"peft": resolved.peft or lora, "training": {**resolved.training, **trains, **training}}
        )
        fitted = fit_to_budget(changed, budget, longest, tiles)
        if fitted is not None:
            found.append((name, fitted.memory))
    return found


def does_not_fit(resolved, fitted: Fitted, longest: int | None, where: str) -> LeapError:
    """The error before any model loads: the budget, the best prediction, what would fit."""
    best = fitted.memory
    tried = ", ".join(f"{c.key}" for c in fitted.changes) or "no default left to change"
    usable = usable_bytes(fitted.budget)
    would = "; ".join(
        f"{name} is predicted at {memory.peak / GIB:.1f} GiB" + (" and fits" if memory.peak <= usable else "")
        for name, memory in alternatives(resolved, fitted.budget, longest, fitted.tiles)
    )
    return LeapError(
        f"the run is predicted to need {best.peak / GIB:.1f} GiB per GPU ({best.parts()}), over the "
        f"{usable / GIB:.1f} GiB a {fitted.budget / GIB:.1f} GiB budget leaves for it (CUDA's "
        f"context and the allocator's slack kept aside), even after {tried}",
        where=where,
        fix=f"{would or 'a shorter max_length, a smaller model, or a GPU with more memory'}; keys you set are never "
        "changed: unset one of them to let leap-finetune choose",
    )


def with_changes(resolved, fitted: Fitted):
    """The resolved config with the fitting's changes in its training settings (recorded: a resume keeps them)."""
    if not fitted.changes:
        return resolved
    keys = {k for c in fitted.changes for k in (c.value if isinstance(c.value, dict) else {c.key: c.value})}
    changed = {k: fitted.training[k] for k in sorted(keys)}
    return resolved.model_copy(update={"training": fitted.training, "fitted_training": changed})


def device_budget(index: str, query: str = "memory.free") -> tuple[int | None, str]:
    """(the free memory of GPU `index` - its physical id -, where it came from), read with nvidia-smi so that the
    driver never creates a CUDA context of its own on a GPU that a training process is about to fill. `query`:
    nvidia-smi's field (memory.total: the card's whole memory)."""
    import shutil
    import subprocess

    if not index or shutil.which("nvidia-smi") is None:
        return None, ""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", index],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        return int(float(out.splitlines()[0]) * 2**20), f"the free memory of GPU {index} (nvidia-smi)"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None, ""


def device_total(index: str) -> int | None:
    """The whole memory of GPU `index` (what vLLM's gpu_memory_utilization is a share of), None off a GPU."""
    return device_budget(index, "memory.total")[0]


def fit_run(resolved, gpu: str | None, prepared, console, *, resuming: bool = False, planning: bool = False):
    """The run's settings fitted to its budget (gpu_memory:, --gpu-memory, else the training GPU's free memory),
    each change printed with its reason; a LeapError (exit 2) when nothing fits. A resumed run keeps its
    checkpoint's settings (a change would be refused by the resume's own checks). `gpu`: the physical id of the
    first training GPU, None on the CPU; `planning` (validate): a budget given is checked on any machine."""
    if gpu is None and not (planning and resolved.gpu_memory):
        if resolved.gpu_memory and not planning:  # (a key with no effect here is said, not silently dropped)
            console.print("note: gpu_memory is not used: this run trains on the CPU", markup=False)
        return resolved
    longest, tiles = longest_row(prepared), row_tiles(resolved, prepared)
    if resuming:  # (the checkpoint's settings, as they are: the prediction only)
        return _predicted(resolved, longest, tiles)
    budget, source = (resolved.gpu_memory, "gpu_memory") if resolved.gpu_memory else device_budget(gpu)
    if budget is None:
        return _predicted(resolved, longest, tiles)
    fitted = fit_to_budget(resolved, budget, longest, tiles)
    if fitted is None:
        return resolved
    for change in fitted.changes:
        console.print(
            f"memory: {change_text(change.key, change.value)} ({change.reason}): predicted ~{change.peak / GIB:.1f} GiB "
            f"of the {budget / GIB:.1f} GiB budget ({source})",
            markup=False,
        )
    if not fitted.fits:
        raise does_not_fit(resolved, fitted, longest, where=f"{resolved.config_path or 'config'}: {source}")
    return with_changes(resolved, fitted).model_copy(update={"predicted_gpu_memory": fitted.memory.peak})


def _predicted(resolved, longest: int | None, tiles: RowTiles | None = None):
    """The resolved config with its training process's predicted peak (the run report and the model card put the
    measured one beside it)."""
    shape = shape_of(resolved) if predicted_for(resolved) else None
    if shape is None:
        return resolved
    peak = predict(resolved, shape, longest, resolved.gpu_memory, tiles).peak
    return resolved.model_copy(update={"predicted_gpu_memory": peak})


def process_memory(resolved, devices, prepared, budget: int | None = None) -> dict:
    """`plan`'s memory of one training process (GPU runs): {"memory": parts, "budget": the fitting} - the fitting
    applied when a budget is given (memory/budget.py)."""
    if not devices.use_gpu and budget is None:  # (with --gpu-memory: planned for that card from this machine)
        return {"memory": None, "why": "CPU: no GPU memory to plan (--gpu-memory 24GiB plans for a card of that size)"}
    if not predicted_for(resolved):
        return {"memory": None, "why": "embedding and ColBERT runs are not predicted yet (docs/memory.md)"}
    longest = longest_row(prepared)
    shape = shape_of(resolved)
    if shape is None:
        return {
            "memory": None,
            "why": f"the config.json of {resolved.model_id} is not at hand (plan downloads nothing)",
        }
    from leap_finetune.memory.servers import rollout_cache

    gpu_bytes = budget if budget is not None else device_total(str(devices.training[0]) if devices.training else "")
    tiles = row_tiles(resolved, prepared)
    memory = predict(resolved, shape, longest, gpu_bytes, tiles)
    found = {"memory": memory, "source": shape.source, "longest_row": longest, "gpu_bytes": gpu_bytes}
    found["note"] = rollout_cache(resolved, shape, longest, gpu_bytes)[1]
    if budget is not None:
        found["fitted"] = fit_to_budget(resolved, budget, longest, tiles)
    return found
