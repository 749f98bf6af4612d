"""Canaries for the private library internals leap-finetune relies on (issue #26).

Our code overrides private methods of library classes, reads their private attributes and functions, and in
places falls back quietly when one is missing (a `getattr(..., default)`, an `except ImportError`, or simply an
override the library no longer calls). After an upgrade such a run would train slower, or wrong, without an
error. Each test fences one family of hooks: the hook still exists, takes the parameters we pass (names, and
order where we pass them by position) and - where that is cheap - still behaves as we rely on. A failure names
our module and the installed library version.

Fenced elsewhere: TRL's data preparation (DPO/KTO `_prepare_dataset`, SFT's `skip_prepare_dataset`) in
tests/recipes/test_trl_canaries.py; the GRPO rollout copy against TRL's fused LM head in tests/rl/test_sampler.py;
peft's state-dict key names of a merged snapshot in tests/evaluation/test_async_eval.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

SRC = Path(__file__).resolve().parents[1] / "src" / "leap_finetune"
DISTRIBUTIONS = {
    "ray": "ray",
    "trl": "trl",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "sentence_transformers": "sentence-transformers",
    "torch": "torch",
    "peft": "peft",
}


# --- how a canary says what changed ------------------------------------------------------------------------


def says(ours, library: str, what: str) -> str:
    """The failure message: our module (a module object, or a text naming where), the library and its installed
    version, what changed."""
    name = ours.__name__ if inspect.ismodule(ours) else ours
    return f"{name} relies on {library} {version(library)}: {what}"


def users(text: str) -> str:
    """Our modules whose source contains `text` (for messages about hooks whose module may move)."""
    found = sorted(str(p.relative_to(SRC.parent)) for p in SRC.rglob("*.py") if text in p.read_text(encoding="utf-8"))
    return ", ".join(found) or f"(no module of ours uses {text} any more)"


def imported(module: str, name: str, ours, library: str):
    """`module.name`, or a failure that says which of our modules needs it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        pytest.fail(says(ours, library, f"{module}.{name} cannot be imported any more ({err})"))


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def assert_parameters(function, expected: list[str], ours, library: str, *, in_order: bool = True) -> None:
    """`function` takes `expected`: as its first parameters in this order (we pass them by position), or anywhere
    (`in_order=False`: we pass them by name)."""
    actual = parameters(function)
    ok = actual[: len(expected)] == expected if in_order else set(expected) <= set(actual)
    assert ok, says(
        ours,
        library,
        f"{getattr(function, '__qualname__', function)} takes {actual}; we pass "
        f"{expected}{' by position' if in_order else ' by name'}",
    )


def assert_override(cls, name: str, ours, *, leading: list[str] | None = None):
    """`cls.name` (ours) overrides a method that a library class above it still defines, with the same parameters
    (an override taking *args, **kwargs: the same `leading` ones). Returns the library's class."""
    base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
    library = DISTRIBUTIONS.get((base or cls.__mro__[1]).__module__.split(".")[0], "transformers")
    mine = cls.__qualname__.rsplit(".", 1)[-1]  # (not __name__: recipes/retrieval.py gives its class the library's)
    assert base is not None, says(
        ours, library, f"no class above our {mine} defines {name} any more: our override is never called"
    )
    theirs = parameters(getattr(base, name))
    if leading is None:
        ours_takes = parameters(vars(cls)[name])
        assert ours_takes == theirs, says(
            ours, library, f"{base.__qualname__}.{name} takes {theirs}, our override {mine}.{name} {ours_takes}"
        )
    else:
        assert theirs[: len(leading)] == leading, says(
            ours, library, f"{base.__qualname__}.{name} takes {theirs}; our override passes {leading} on by position"
        )
    return base


def assert_calls(base, call: str, ours, library: str) -> None:
    """The library's own code (the module defining `base`) still contains `call`: the hook is still reached."""
    source = inspect.getsource(inspect.getmodule(base))
    assert call in source, says(
        ours,
        library,
        f"{inspect.getmodule(base).__name__} no longer contains `{call}`: our override or hook is no longer reached",
    )


# --- shared tiny objects -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer("tiny-lfm2")


@pytest.fixture(scope="module")
def sft_trainer(tokenizer, tmp_path_factory):
    """recipes/sft.py's trainer on a few tokenized rows, padding-free with the balanced sampler (a GPU run's
    defaults), on the CPU."""
    from datasets import Dataset
    from trl import SFTConfig

    from leap_finetune.recipes import sft

    rows = Dataset.from_list(
        [{"input_ids": list(range(5, 5 + n)), "labels": list(range(5, 5 + n))} for n in (3, 9, 4, 7, 5, 6, 8, 2)]
    )
    args = SFTConfig(
        output_dir=str(tmp_path_factory.mktemp("sft")),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=2,
        dataset_kwargs={"skip_prepare_dataset": True},
        padding_free=True,
        max_length=None,
        train_sampling_strategy="batch_rebalance",
    )
    return sft.trainer_class()(
        model=build_tiny_model("tiny-lfm2", tokenizer), args=args, train_dataset=rows, processing_class=tokenizer
    )


@pytest.fixture(scope="module")
def grpo_trainer(tokenizer, tmp_path_factory):
    """recipes/grpo.py's trainer with transformers rollouts, a static cache and temperature / top-k / top-p: the
    settings with which it decodes with leap-finetune's own loop."""
    from datasets import Dataset
    from trl import GRPOConfig

    from leap_finetune.recipes import grpo

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        use_vllm=False,
        cache_implementation="static",
        temperature=0.7,
        top_k=20,
        top_p=0.9,
    )
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "Say red."}]}] * 4)
    return grpo.trainer_class()(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        args=args,
        train_dataset=rows,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        processing_class=tokenizer,
    )


# --- Ray Train (launch/distributed.py) -----------------------------------------------------------------------


def test_ray_torch_trainer_overrides(tmp_path):
    """launch/distributed.py `_leap_trainer` subclasses Ray Train's TorchTrainer: `_register_sigint_handler` leaves the
    driver's signals to leap-finetune (Ray's own handler aborts a run without a checkpoint) and
    `_create_default_callbacks` drops the PlacementGroupCleanerCallback, imported from ray.train.v2._internal under
    an `except ImportError` that keeps Ray's callbacks. Renamed, moved or no longer called, either is skipped
    silently: Ctrl-C aborts without a checkpoint, and every run without a dashboard ends ~12 s late with a traceback."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from leap_finetune.launch import distributed

    cleaner = imported(
        "ray.train.v2._internal.callbacks.placement_group_callback", "PlacementGroupCleanerCallback", distributed, "ray"
    )
    for name in ("_register_sigint_handler", "_create_default_callbacks"):
        base = assert_override(distributed._leap_trainer(cleaner=False), name, distributed)
        assert_calls(base, f"self.{name}(", distributed, "ray")
    for keep in (True, False):  # (built, not fitted: no Ray instance is started)
        trainer = distributed._leap_trainer(cleaner=keep)(
            lambda config: None,
            train_loop_config={},
            scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
            torch_config=TorchConfig(backend="gloo"),
            run_config=RunConfig(
                name="ray",
                storage_path=str(tmp_path),
                failure_config=FailureConfig(max_failures=0),
                worker_runtime_env={"env_vars": {}},
            ),
        )
        kinds = [type(callback) for callback in trainer._create_default_callbacks()]
        assert (cleaner in kinds) == keep, says(
            distributed,
            "ray",
            (
                "Ray's default callbacks no longer include PlacementGroupCleanerCallback"
                if keep
                else "PlacementGroupCleanerCallback is still among the callbacks after our override removed it (Ray builds it "
                "from another class or path)"
            ),
        )


def test_ray_dashboard_probe_reaches_rays_private_helper(monkeypatch):
    """launch/distributed.py `_has_dashboard` asks the private ray._private.worker.get_dashboard_url and answers True on
    any exception ("assume the cluster has one"): moved or changed, the helper would keep the placement-group cleaner
    on every cluster without a dashboard (the slow, noisy end of each run). Ray's helper reads
    RAY_OVERRIDE_DASHBOARD_URL before any connection, so both answers are asked for without starting Ray."""
    from leap_finetune.launch import distributed

    helper = imported("ray._private.worker", "get_dashboard_url", distributed, "ray")
    assert_parameters(helper, [], distributed, "ray")
    monkeypatch.setenv("RAY_OVERRIDE_DASHBOARD_URL", "")
    assert distributed._has_dashboard() is False, says(
        distributed,
        "ray",
        (
            "with an empty dashboard URL `_has_dashboard` still says there is a dashboard: get_dashboard_url raised (our "
            "fallback answered) or no longer reads RAY_OVERRIDE_DASHBOARD_URL"
        ),
    )
    monkeypatch.setenv("RAY_OVERRIDE_DASHBOARD_URL", "http://127.0.0.1:8265")
    assert distributed._has_dashboard() is True, says(distributed, "ray", "a dashboard URL is not seen as a dashboard")


def test_ray_train_sets_what_our_workers_and_driver_read():
    """What Ray Train sets or writes that leap-finetune reads with a quiet default:
    - RANK and WORLD_SIZE in every worker's environment (recipes/common.py `is_main_process` defaults to rank 0 and
      recipes/retrieval.py `several_workers` to one worker: unset, every worker would write the run folder and
      retrieval runs would not gather documents across workers);
    - TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, which the driver lowers so a failed run is reported in 5 s, not 30;
    - the `[Rank N Error Snippet]` header of a worker's error, from which the failure message names the rank;
    - the Ray Train v2 arguments run_on_ray passes."""
    import ray
    import ray.train.constants as train_constants
    from ray.train import RunConfig, ScalingConfig

    from leap_finetune.launch import distributed
    from leap_finetune.recipes import common, retrieval

    config = importlib.import_module("ray.train.torch.config")
    source = inspect.getsource(config)
    for name, ours in (("RANK", common), ("WORLD_SIZE", retrieval), ("LOCAL_RANK", common)):
        assert f'os.environ["{name}"]' in source, says(
            ours, "ray", f"ray.train.torch.config no longer sets {name} in the workers' environment"
        )
    assert (
        getattr(train_constants, "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", None)
        == "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"
        and "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S" in source
    ), says(
        distributed,
        "ray",
        "Ray Train no longer reads TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S: failed runs are "
        "reported after Ray's own 30 s",
    )
    poll = inspect.getsource(importlib.import_module("ray.train.v2._internal.execution.worker_group.poll"))
    assert "[Rank {" in poll and "Error Snippet]" in poll, says(
        distributed,
        "ray",
        ("a worker's error no longer starts with [Rank N Error Snippet]: the failure message says 'a worker'"),
    )
    said = distributed._failure_message(
        RuntimeError("Training failed.\n[Rank 1 Error Snippet]:\nValueError: boom"), Path("run")
    )
    assert said.startswith("worker rank 1 failed: ValueError: boom"), said  # (what that header is read for)
    assert_parameters(
        RunConfig, ["name", "storage_path", "failure_config", "worker_runtime_env"], distributed, "ray", in_order=False
    )
    assert_parameters(
        ScalingConfig, ["num_workers", "use_gpu", "resources_per_worker"], distributed, "ray", in_order=False
    )
    assert_parameters(
        ray.init,
        [
            "address",
            "num_cpus",
            "num_gpus",
            "include_dashboard",
            "logging_level",
            "logging_config",
            "runtime_env",
            "log_to_driver",
        ],
        distributed,
        "ray",
        in_order=False,
    )
    assert issubclass(ray.train.TrainingFailedError, Exception), says(distributed, "ray", "no TrainingFailedError")


# --- GRPO (recipes/grpo.py, rl/sampler.py) ---------------------------------------------------------------------


def test_grpo_rollouts_reach_our_generate_single_turn(grpo_trainer, monkeypatch):
    """recipes/grpo.py `LeapGRPOTrainer._generate_single_turn` replaces TRL's rollout through transformers' generate
    with leap-finetune's decoding loop (`_sample`) and counts rollout tokens/s. TRL calls it by position (prompt_ids,
    images, multimodal_fields, num_generations) and by keyword (has_tool_images), and ours hands everything on to
    TRL's by position: a renamed, reordered or added parameter, or a TRL that stops calling the method, would send
    every rollout back to generate (~3x slower, bench/RESULTS.md) and lose rollout/tokens_per_s, silently."""
    from trl import GRPOTrainer

    from leap_finetune.recipes import grpo

    cls = type(grpo_trainer)
    assert_override(cls, "_generate_single_turn", grpo)
    assert_override(cls, "log", grpo)  # (rollout/tokens_per_s and completions.jsonl are written there)
    assert parameters(GRPOTrainer._generate)[:2] == ["self", "prompts"], says(
        grpo,
        "trl",
        (f"GRPOTrainer._generate, TRL's rollout that this canary calls, takes {parameters(GRPOTrainer._generate)}"),
    )
    sampled = []
    sample = grpo_trainer._sample
    monkeypatch.setattr(
        grpo_trainer,
        "_sample",
        lambda prompt_ids, **kw: sampled.append(len(prompt_ids)) or sample(prompt_ids, **kw),
    )
    tokens = grpo_trainer._rollout_tokens
    grpo_trainer._generate([[{"role": "user", "content": "Say red."}]] * 2)
    assert sampled == [2], says(
        grpo,
        "trl",
        "GRPOTrainer._generate no longer reaches our _generate_single_turn "
        "(or it no longer samples with leap-finetune's loop)",
    )
    assert grpo_trainer._rollout_tokens > tokens, says(grpo, "trl", "rollout tokens are no longer counted")


def test_grpo_trainer_attributes_we_read(grpo_trainer):
    """What LeapGRPOTrainer reads from TRL's GRPOTrainer after construction: `__init__` picks the rollout engine from
    use_vllm, use_transformers_continuous_batching, is_fsdp_enabled, is_deepspeed_enabled, _is_vlm and TRL's
    generation_config / generation_kwargs (asked through trl.models.unwrap_model_for_generation); `_sample` pads
    with trl.trainer.utils.pad, profiles with trl.extras.profiling.profiling_context and reads _tokenizer,
    pad_to_multiple_of, eos_token_ids, max_completion_length; `log` reads `_logs`; rl/judge.py `judges` reads
    `reward_funcs` with a default of [] (renamed: a judge that is down never stops the run). With this test's
    settings the engine must be leap-finetune's sampler: anything else means a hook changed and rollouts fell
    back to generate."""
    from leap_finetune.recipes import grpo
    from leap_finetune.rl import judge

    names = (
        "use_vllm",
        "use_transformers_continuous_batching",
        "is_fsdp_enabled",
        "is_deepspeed_enabled",
        "_is_vlm",
        "model_wrapped",
        "accelerator",
        "generation_kwargs",
        "generation_config",
        "_tokenizer",
        "pad_to_multiple_of",
        "eos_token_ids",
        "max_completion_length",
        "_logs",
    )
    missing = [name for name in names if not hasattr(grpo_trainer, name)]
    assert not missing, says(grpo, "trl", f"GRPOTrainer no longer sets {missing}")
    assert {"prompt", "completion", "rewards", "advantages"} <= set(grpo_trainer._logs), says(
        grpo, "trl", f"GRPOTrainer._logs holds {sorted(grpo_trainer._logs)}"
    )
    assert len(getattr(grpo_trainer, "reward_funcs", [])) == 1, says(judge, "trl", "GRPOTrainer.reward_funcs is gone")
    assert grpo_trainer.rollout_engine == "leap-finetune sampler", says(
        grpo,
        "trl",
        (
            f"(with transformers {version('transformers')}) the rollout engine is {grpo_trainer.rollout_engine!r} "
            f"({grpo_trainer.rollout_why_not}), not leap-finetune's sampler"
        ),
    )
    # TRL builds its GenerationConfig uncompiled; __init__ turns compilation on for a static cache on a GPU
    assert (
        grpo_trainer.generation_config.cache_implementation == "static"
        and grpo_trainer.generation_config.disable_compile is True
    ), says(grpo, "trl", ("TRL's generation_config no longer carries cache_implementation and disable_compile=True"))
    assert hasattr(grpo_trainer.args, "gradient_checkpointing_kwargs"), says(
        grpo, "transformers", "TrainingArguments.gradient_checkpointing_kwargs is gone"
    )
    unwrap = imported("trl.models", "unwrap_model_for_generation", grpo, "trl")
    assert_parameters(unwrap, ["model", "accelerator"], grpo, "trl")
    assert_parameters(unwrap, ["generation_kwargs", "gradient_checkpointing_kwargs"], grpo, "trl", in_order=False)
    assert_parameters(
        imported("trl.extras.profiling", "profiling_context", grpo, "trl"), ["trainer", "name"], grpo, "trl"
    )
    pad = imported("trl.trainer.utils", "pad", grpo, "trl")
    assert_parameters(pad, ["tensors"], grpo, "trl")
    assert_parameters(pad, ["padding_value", "padding_side", "pad_to_multiple_of"], grpo, "trl", in_order=False)


def test_sampler_uses_generates_own_processors_and_cache(tokenizer):
    """rl/sampler.py decodes a rollout itself only where it samples exactly what generate would: it asks the model for
    generate's settings and logits processors (the private GenerationMixin `_prepare_generation_config` and
    `_get_logits_processor`), applies them as `processor(None, scores)`, and recognises temperature / top-k / top-p by
    their class names - any other processor sends the rollout back to generate. Renamed processors would make every
    rollout slower without a word; a changed call or cache API would fail mid-run, on a GPU only."""
    from transformers import AttentionInterface, GenerationConfig, StaticCache
    from transformers.generation.configuration_utils import GenerationMode
    from transformers.masking_utils import AttentionMaskInterface

    from leap_finetune.rl import sampler

    model = build_tiny_model("tiny-lfm2", tokenizer).eval()
    assert_parameters(model._prepare_generation_config, ["generation_config"], sampler, "transformers")
    assert_parameters(
        model._get_logits_processor, ["generation_config", "input_ids_seq_length"], sampler, "transformers"
    )
    config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        suppress_tokens=[5],  # (TRL's for a vision-language model: its image token)
        cache_implementation="static",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id],
    )
    prepared, kwargs = model._prepare_generation_config(config)
    assert isinstance(prepared, GenerationConfig) and isinstance(kwargs, dict), says(
        sampler, "transformers", "_prepare_generation_config no longer returns (GenerationConfig, kwargs)"
    )
    assert prepared.get_generation_mode() == GenerationMode.SAMPLE, says(sampler, "transformers", "no SAMPLE mode")
    processors = model._get_logits_processor(prepared, input_ids_seq_length=1)
    names = sorted(type(p).__name__ for p in processors)
    assert names == sorted(sampler.SAMPLING_PROCESSORS), says(
        sampler,
        "transformers",
        (
            f"temperature, top-k, top-p and suppressed tokens are now {names}, not {sorted(sampler.SAMPLING_PROCESSORS)}: "
            "rollouts fall back "
            "to generate"
        ),
    )
    scores = torch.randn(2, len(tokenizer))
    for processor in processors:
        scores = processor(None, scores)  # (as the loop applies them: they read the scores only)
    assert scores.shape == (2, len(tokenizer))
    assert sampler.why_not(model, config) is None, says(sampler, "transformers", sampler.why_not(model, config))
    cache = StaticCache(config=model.config, max_cache_len=8)
    cache.reset()
    assert_parameters(
        type(model).forward,
        ["input_ids", "attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep"],
        sampler,
        "transformers",
        in_order=False,
    )
    for interface in (AttentionInterface, AttentionMaskInterface):
        assert_parameters(interface.register, ["key", "value"], sampler, "transformers")
    assert callable(getattr(torch, "_foreach_copy_", None)), says(sampler, "torch", "torch._foreach_copy_ is gone")
    assert callable(getattr(torch.compiler, "cudagraph_mark_step_begin", None)), says(
        sampler, "torch", "torch.compiler.cudagraph_mark_step_begin is gone"
    )


# --- SFT (recipes/sft.py, recipes/sampling.py, recipes/speed.py, models/) ----------------------------------------


def test_sft_balanced_sampler_is_what_the_trainer_iterates(sft_trainer):
    """recipes/sft.py overrides the Trainer's private `_get_train_sampler` to return recipes/sampling.py's
    TokenBalancedSampler, a subclass of transformers' BatchRebalanceSampler that overrides its private `_assign`; the
    Trainer hands a BatchRebalanceSampler to the DataLoader as its batch sampler. A renamed `_get_train_sampler` or
    `_assign` would silently train with the default sampler or transformers' contiguous split (~10% of two GPUs'
    time lost waiting, recipes/sampling.py)."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    from leap_finetune.recipes import sampling, sft

    assert_override(type(sft_trainer), "_get_train_sampler", sft)
    assert_override(sampling._token_balanced_class(), "_assign", sampling)
    assert_parameters(
        BatchRebalanceSampler,
        ["lengths", "effective_batch_size", "dp_size", "grad_accum", "rank", "drop_last", "seed"],
        sampling,
        "transformers",
        in_order=False,
    )
    loader = sft_trainer.get_train_dataloader()
    chosen = sft_trainer._sampler_epoch.sampler
    assert type(chosen).__name__ == "TokenBalancedSampler", says(
        sft, "transformers", (f"the Trainer no longer asks our _get_train_sampler (our sampler: {chosen!r})")
    )
    iterated = getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler)
    assert iterated is chosen, says(
        sft,
        "transformers",
        (f"the train DataLoader iterates {type(iterated).__name__}, not the sampler our _get_train_sampler returned"),
    )
    assert (chosen.dp_size, chosen.grad_accum) == (1, 1), says(sampling, "transformers", "dp_size / grad_accum")
    assigned = []
    assign = chosen._assign
    chosen._assign = lambda indices, lengths: assigned.append(len(indices)) or assign(indices, lengths)
    try:
        batches = list(chosen)
    finally:
        del chosen._assign
    assert assigned and sorted(i for batch in batches for i in batch) == list(range(8)), says(
        sampling, "transformers", "BatchRebalanceSampler no longer deals its batches through self._assign"
    )


def test_packing_hooks_keep_documents_apart(sft_trainer, tokenizer, monkeypatch):
    """Padding-free and packed SFT keep documents apart through what TRL's padding-free collator passes down: `seq_idx`
    to the convolution and `cu_seq_lens_q` / `max_length_q` to attention.
    - models/packed_conv.py replaces the module global `causal_conv1d_fn` of transformers' LFM2 modeling modules
      (getattr default: nothing is patched) and relies on the short convolution looking it up at call time:
      otherwise packed documents would silently mix through the convolution.
    - models/varlen_attention.py reads the private `config._attn_implementation` (getattr default None: a user's
      flash_attention_2 would be silently replaced) and registers with AttentionInterface / AttentionMaskInterface,
      calling sdpa_attention_forward / sdpa_mask for padded batches.
    - recipes/speed.py chooses padding-free batches only if torch.nn.attention.varlen imports (otherwise, silently,
      padded batches: 1.47x slower on the H200), and raises torch._dynamo's recompile limits."""
    import torch._dynamo
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    from leap_finetune.models import packed_conv, varlen_attention
    from leap_finetune.recipes import speed

    batch = next(iter(sft_trainer.get_train_dataloader()))
    assert {"seq_idx", "cu_seq_lens_q", "max_length_q", "position_ids"} <= set(batch), says(
        varlen_attention, "trl", f"TRL's padding-free batches now hold {sorted(batch)}"
    )
    for name in packed_conv._PATCHED_MODULES:
        module = importlib.import_module(name)
        function = packed_conv.UPSTREAM.get(name, getattr(module, "causal_conv1d_fn", None))
        assert callable(function), says(
            packed_conv,
            "transformers",
            f"{name}.causal_conv1d_fn is gone: nothing is "
            "patched and packed LFM2 documents mix through the convolution",
        )
        assert_parameters(function, ["hidden_states", "weight", "bias"], packed_conv, "transformers")
    modeling = importlib.import_module(packed_conv._PATCHED_MODULES[0])
    called = []
    current = modeling.causal_conv1d_fn
    monkeypatch.setattr(modeling, "causal_conv1d_fn", lambda *a, **k: called.append(1) or current(*a, **k))
    model = build_tiny_model("tiny-lfm2", tokenizer).eval()
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), use_cache=False)
    assert called, says(
        packed_conv,
        "transformers",
        f"LFM2's short convolution no longer calls {modeling.__name__}"
        ".causal_conv1d_fn at call time: replacing it changes nothing",
    )
    assert getattr(model.config, "_attn_implementation", None) == "sdpa", says(
        varlen_attention, "transformers", ("config._attn_implementation no longer names the model's attention")
    )
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager", says(
        varlen_attention, "transformers", ("set_attn_implementation no longer shows in config._attn_implementation")
    )
    assert_parameters(
        sdpa_attention_forward, ["module", "query", "key", "value", "attention_mask"], varlen_attention, "transformers"
    )
    assert_parameters(sdpa_attention_forward, ["dropout", "scaling"], varlen_attention, "transformers", in_order=False)
    assert_parameters(sdpa_mask, ["attention_mask"], varlen_attention, "transformers", in_order=False)
    assert speed.varlen_kernel_available(), says(
        speed,
        "torch",
        "torch.nn.attention.varlen.varlen_attn cannot be imported: GPU runs silently train with padded batches",
    )
    kernel = imported("torch.nn.attention.varlen", "varlen_attn", varlen_attention, "torch")
    assert_parameters(
        kernel, ["query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"], varlen_attention, "torch"
    )
    assert "scale" in parameters(kernel) and {"is_causal", "window_size"} & set(parameters(kernel)), says(
        varlen_attention, "torch", f"varlen_attn takes {parameters(kernel)}: no scale, or no causal switch"
    )
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        assert hasattr(torch._dynamo.config, name), says(speed, "torch", f"torch._dynamo.config.{name} is gone")


# --- Retrieval (recipes/retrieval.py) ----------------------------------------------------------------------------


def test_retrieval_trainer_overrides(tokenizer, tmp_path, monkeypatch):
    """recipes/retrieval.py `leap_trainer` subclasses sentence-transformers' trainers. On several workers it draws one
    batch for all of them: `_build_dataloader` multiplies the batch size, `get_batch_sampler` wraps the no-duplicates
    sampler in FullBatches, and `get_train_dataloader` re-implements sentence-transformers' own with even batches;
    `_track_num_input_tokens` (transformers' Trainer) counts every `<column>_input_ids` / `_attention_mask` of
    sentence-transformers' batches; `_load_from_checkpoint` loads LoRA checkpoints. Renamed or no longer called,
    each override is silently skipped: workers would train on half-size or overlapping batches, tokens seen would
    be 0, a LoRA resume would fail. The losses gather documents across workers (`gather_across_devices`), and the
    recipes replace `model_card_data.set_widget_examples` (a progress bar in the run's output otherwise)."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoderTrainer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import Trainer

    from leap_finetune.recipes import retrieval

    monkeypatch.setenv("WORLD_SIZE", "2")  # (read when the class is made: several workers' overrides)
    classes = [retrieval.leap_trainer(SentenceTransformerTrainer), retrieval.leap_trainer(MultiVectorEncoderTrainer)]
    monkeypatch.delenv("WORLD_SIZE")
    for cls in classes:
        for name in ("_build_dataloader", "get_train_dataloader", "_track_num_input_tokens", "_load_from_checkpoint"):
            assert_override(cls, name, retrieval)
        assert_override(cls, "get_batch_sampler", retrieval, leading=["self", "dataset", "batch_size"])
    assert_calls(Trainer, "self._track_num_input_tokens(inputs)", retrieval, "transformers")
    assert_calls(Trainer, "self._load_from_checkpoint(resume_from_checkpoint)", retrieval, "transformers")
    from sentence_transformers.multi_vector_encoder import losses as multi_vector

    for loss in (
        losses.MultipleNegativesRankingLoss,
        losses.CachedMultipleNegativesRankingLoss,
        multi_vector.MultiVectorMultipleNegativesRankingLoss,
        multi_vector.CachedMultiVectorMultipleNegativesRankingLoss,
    ):
        names = ["model", "gather_across_devices"] + (["mini_batch_size"] if "Cached" in loss.__name__ else [])
        assert_parameters(loss, names, users("gather_across_devices"), "sentence-transformers", in_order=False)

    folder = tmp_path / "backbone"
    build_tiny_model("tiny-lfm2", tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformer = Transformer(str(folder))
    model = SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode="lasttoken")], device="cpu"
    )
    widgets = []
    monkeypatch.setattr(model.model_card_data, "set_widget_examples", lambda dataset: widgets.append(dataset))
    rows = Dataset.from_list([{"query": f"question {i}", "positive": f"answer {i}"} for i in range(6)])
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        report_to="none",
        batch_sampler="no_duplicates",
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
    )
    trainer = classes[0](
        model=model, args=args, train_dataset=rows, eval_dataset=rows, loss=losses.MultipleNegativesRankingLoss(model)
    )
    assert widgets, says(
        retrieval,
        "sentence-transformers",
        "model_card_data.set_widget_examples is no longer what the trainer calls (our replacement of it does nothing)",
    )
    built = []
    build = trainer._build_dataloader
    monkeypatch.setattr(
        trainer,
        "_build_dataloader",
        lambda dataset, batch_size, dataset_kind: (
            built.append(dataset_kind) or build(dataset, batch_size, dataset_kind)
        ),
    )
    loader = trainer.get_train_dataloader()
    sampler = getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler)
    assert isinstance(sampler, retrieval.FullBatches), says(
        retrieval,
        "sentence-transformers",
        (f"the train batches come from {type(sampler).__name__}: _build_dataloader no longer asks get_batch_sampler"),
    )
    assert trainer.accelerator.even_batches is True
    trainer.get_eval_dataloader()  # sentence-transformers' own: through our _build_dataloader too
    assert built == ["train", "eval"], says(retrieval, "sentence-transformers", f"dataloaders built: {built}")
    # sentence-transformers' own get_train_dataloader, which ours re-implements, still does what ours does
    built.clear()
    theirs = SentenceTransformerTrainer.get_train_dataloader(trainer)
    assert built == ["train"] and trainer._train_dataloader is theirs and trainer.accelerator.even_batches is False, (
        says(
            retrieval,
            "sentence-transformers",
            "SentenceTransformerTrainer.get_train_dataloader changed: re-read our "
            "get_train_dataloader, which copies it",
        )
    )
    columns = set(next(iter(loader)))
    assert {"query_input_ids", "query_attention_mask", "positive_input_ids"} <= columns, says(
        retrieval, "sentence-transformers", f"batches now hold {sorted(columns)}: _track_num_input_tokens counts none"
    )
    trainer.state.num_input_tokens_seen = 0
    trainer._track_num_input_tokens(
        {
            "query_input_ids": torch.ones(2, 3),
            "query_attention_mask": torch.ones(2, 3),
            "positive_attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        }
    )
    assert trainer.state.num_input_tokens_seen == 0  # (kept on the device until a log or checkpoint reads it)
    trainer._flush_device_metrics()
    assert trainer.state.num_input_tokens_seen == 9, says(
        retrieval, "transformers", "include_num_input_tokens_seen / state.num_input_tokens_seen"
    )


# --- What every recipe reads from transformers' Trainer (recipes/common.py, recipes/callbacks.py) ----------------


def test_trainer_internals_the_end_of_a_run_reads(sft_trainer):
    """recipes/common.py reads `is_fsdp_enabled` with getattr(..., False) in three places: renamed, an FSDP run would
    save rank 0's shard as the model (no gathered state dict) and print samples from a sharded model, silently.
    `train_or_finish` ends a run resumed at its last step as transformers' train() ends one: `is_in_train`, the
    callback handler's `on_train_end(args, state, control)` and the private `_load_best_model()`."""
    from transformers import Trainer

    from leap_finetune.recipes import common

    for name in ("is_fsdp_enabled", "is_deepspeed_enabled"):
        assert isinstance(getattr(sft_trainer, name, None), bool), says(
            common, "transformers", f"Trainer.{name} is no longer set"
        )
    assert isinstance(getattr(sft_trainer, "is_in_train", None), bool), says(common, "transformers", "is_in_train")
    assert_parameters(Trainer._load_best_model, ["self"], common, "transformers")
    assert_parameters(
        type(sft_trainer.callback_handler).on_train_end, ["self", "args", "state", "control"], common, "transformers"
    )
    assert_calls(Trainer, "self._load_best_model()", common, "transformers")
    from accelerate import Accelerator

    assert_parameters(Accelerator.get_state_dict, ["self", "model"], common, "accelerate")  # (FSDP: the whole model)


def test_resume_changes_reach_the_scheduler_accelerate_wraps():
    """recipes/callbacks.py ResumeChanges puts a resume's new learning rate into the restored optimizer and scheduler.
    It takes them from on_train_begin's `optimizer` / `lr_scheduler` arguments, unwraps accelerate's scheduler
    through `.scheduler` (getattr default: the wrapper itself), recomputes the rate only for a scheduler with
    `lr_lambdas`, and writes torch's private `_last_lr`. If any of these changed, the resumed run would silently keep
    the checkpoint's schedule."""
    from accelerate.scheduler import AcceleratedScheduler
    from transformers import TrainerControl, TrainerState, get_scheduler
    from transformers.trainer_callback import CallbackHandler

    from leap_finetune.recipes import callbacks

    assert_parameters(
        CallbackHandler,
        ["callbacks", "model", "processing_class", "optimizer", "lr_scheduler"],
        callbacks,
        "transformers",
    )
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=1.0)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    wrapped = AcceleratedScheduler(scheduler, optimizer)
    assert getattr(wrapped, "scheduler", None) is scheduler, says(
        callbacks, "accelerate", ("AcceleratedScheduler no longer keeps the scheduler it wraps as .scheduler")
    )
    for name in ("lr_lambdas", "base_lrs", "last_epoch", "_last_lr"):
        assert hasattr(scheduler, name), says(callbacks, "torch", f"get_scheduler's scheduler has no {name}")
    state = TrainerState(global_step=5)
    handler = CallbackHandler(
        [callbacks.ResumeChanges({"training_config.learning_rate": 0.5})],
        model=None,
        processing_class=None,
        optimizer=optimizer,
        lr_scheduler=wrapped,
    )
    handler.on_train_begin(SimpleNamespace(learning_rate=0.5), state, TrainerControl())
    expected = 0.5 * scheduler.lr_lambdas[0](scheduler.last_epoch)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(expected) and scheduler.get_last_lr() == pytest.approx(
        [expected]
    ), says(
        callbacks,
        "transformers",
        (
            f"a resumed learning rate of 0.5 did not reach the optimizer and scheduler (lr "
            f"{optimizer.param_groups[0]['lr']}, last lr {scheduler.get_last_lr()}, expected {expected})"
        ),
    )


# --- Chat templates, rendering and config checks (data/, config/) ------------------------------------------------


def test_chat_template_internals(tokenizer):
    """data/chat_templates.py checks a template's syntax with transformers' private `_compile_jinja_template` (the
    environment that knows {% generation %}), reads TRL's copies of LiquidAI's templates, and asks TRL's
    get_training_chat_template for the {% generation %} variant of a known template under `except Exception`
    (moved or failing: the assistant-only loss silently becomes unavailable). data/render.py renders with
    render_jinja_template's character spans of the generation blocks, and tokenizes through the fast tokenizer's
    backend (getattr defaults: silently the slow path, as data/cache.py's cache is then skipped too)."""
    from leap_finetune.data import chat_templates, render
    from leap_finetune.errors import LeapError

    imported("transformers.utils.chat_template_utils", "_compile_jinja_template", chat_templates, "transformers")
    chat_templates._check_syntax("{% generation %}{{ messages[0]['content'] }}{% endgeneration %}", "test")
    with pytest.raises(LeapError, match="not valid Jinja"):
        chat_templates._check_syntax("{% if %}", "test")
    for name in chat_templates.BUILTIN_TEMPLATES:
        loaded = chat_templates.load_chat_template(name, tokenizer)
        assert loaded.text and chat_templates._GENERATION.search(loaded.training), says(
            chat_templates, "trl", f"trl/chat_templates has no marked training variant of {name}"
        )
    get_training = imported("trl.chat_template_utils", "get_training_chat_template", chat_templates, "trl")
    assert_parameters(get_training, ["processing_class"], chat_templates, "trl")
    variant = chat_templates._training_variant(chat_templates._trl_template("qwen3.jinja"), tokenizer)
    assert variant is not None and chat_templates._GENERATION.search(variant), says(
        chat_templates,
        "trl",
        (
            "no {% generation %} variant of TRL's own Qwen3 template: get_training_chat_template failed (our except "
            "Exception answered None)"
        ),
    )
    assert_parameters(
        render.render_jinja_template,
        ["conversations", "tools", "chat_template", "add_generation_prompt", "return_assistant_tokens_mask"],
        render,
        "transformers",
        in_order=False,
    )
    texts, spans = render.render_jinja_template(
        conversations=[[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]],
        chat_template=chat_templates._trl_template(chat_templates.BUILTIN_TEMPLATES["lfm2"][1]),
        return_assistant_tokens_mask=True,
        bos_token="<|startoftext|>",
        eos_token="<|im_end|>",
        pad_token="",
    )
    assert [texts[0][start:end] for start, end in spans[0]] == ["yo<|im_end|>\n"], says(
        render,
        "transformers",
        (f"the generation spans are {spans}: no longer the character spans of the assistant's text"),
    )
    template = chat_templates.load_chat_template("lfm2", tokenizer)
    assert render.Renderer(tokenizer, template, "all", None).backend is not None, says(
        render,
        "transformers",
        ("a fast tokenizer no longer has is_fast / backend_tokenizer: rows are tokenized one by one"),
    )


def test_config_checks_read_library_internals():
    """`validate` checks training_config values with what transformers and TRL build: config/arguments.py reads the
    typed options of HfArgumentParser through argparse's private `_actions` (none read: every value passes
    unchecked, and fails at the first step instead) and the values TRL lists only in a field's help text
    (`loss_type`); other checks import names from inside library modules (the cache implementations, the attention
    functions, the trackers, the quantization configs, the optimizer a Trainer would build)."""
    import dataclasses

    from trl import DPOConfig, SFTConfig

    from leap_finetune.config import arguments

    options = arguments._options(SFTConfig)
    typed = (
        getattr(options.get("learning_rate"), "type", None),
        getattr(options.get("max_steps"), "type", None),
        "cosine" in (getattr(options.get("lr_scheduler_type"), "choices", None) or []),
    )
    assert typed == (float, int, True), says(
        arguments,
        "transformers",
        (f"HfArgumentParser's argparse actions (parser._actions) no longer carry the fields' types: {typed}"),
    )
    fields = {field.name: field for field in dataclasses.fields(DPOConfig)}
    for name in arguments.CHOICES_IN_HELP:
        assert "sigmoid" in arguments._help_choices(fields[name]), says(
            arguments,
            "trl",
            (f"DPOConfig.{name}'s help no longer lists its values as `'name'`: a misspelt {name} passes validate"),
        )
    static = imported(
        "transformers.generation.configuration_utils",
        "ALL_CACHE_IMPLEMENTATIONS",
        users("ALL_CACHE_IMPLEMENTATIONS"),
        "transformers",
    )
    assert "static" in static, says(users("ALL_CACHE_IMPLEMENTATIONS"), "transformers", f"caches: {static}")
    attention = imported(
        "transformers.modeling_utils", "ALL_ATTENTION_FUNCTIONS", users("ALL_ATTENTION_FUNCTIONS"), "transformers"
    )
    assert "sdpa" in list(attention.valid_keys()), says(users("ALL_ATTENTION_FUNCTIONS"), "transformers", "valid_keys")
    trackers = imported(
        "transformers.integrations.integration_utils",
        "INTEGRATION_TO_CALLBACK",
        users("INTEGRATION_TO_CALLBACK"),
        "transformers",
    )
    assert {"tensorboard", "wandb"} <= set(trackers), says(users("INTEGRATION_TO_CALLBACK"), "transformers", "trackers")
    imported(
        "transformers.integrations.integration_utils",
        "get_available_reporting_integrations",
        users("get_available_reporting_integrations"),
        "transformers",
    )
    quantization = imported(
        "transformers.quantizers.auto", "AutoQuantizationConfig", users("AutoQuantizationConfig"), "transformers"
    )
    assert callable(getattr(quantization, "from_dict", None)), says(
        users("AutoQuantizationConfig"), "transformers", "AutoQuantizationConfig.from_dict"
    )
    imported("datasets.table", "InMemoryTable", users("InMemoryTable"), "datasets")
    from transformers import Trainer

    assert_parameters(
        Trainer.get_optimizer_cls_and_kwargs, ["args"], users("get_optimizer_cls_and_kwargs"), "transformers"
    )


def test_servers_we_start_as_python_modules():
    """launch/rl_servers.py starts GRPO's servers as modules of the run's own Python: TRL's `python -m trl.cli.main
    vllm-serve` with our flags, and `python -m transformers.cli.transformers serve` for a local judge without vLLM.
    Moved or renamed, a run would wait for a server that never starts (its whole start timeout). transformers' CLI is
    read without importing it (its serving stack takes seconds to import)."""
    import ast

    from leap_finetune.launch import rl_servers

    for command in (rl_servers.TRL_CLI, rl_servers.TRANSFORMERS_CLI):
        assert importlib.util.find_spec(command[1]) is not None, says(
            rl_servers, command[1].split(".")[0], f"no module {command[1]}"
        )
    commands = imported("trl.cli.commands", "get_commands", rl_servers, "trl")
    assert "vllm-serve" in {c.name for c in commands()}, says(rl_servers, "trl", "`trl vllm-serve` is gone")
    parser = imported("trl.scripts.vllm_serve", "make_parser", rl_servers, "trl")(prog="trl vllm-serve")
    _, unknown = parser.parse_known_args(
        [
            "--model",
            "m",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--tensor-parallel-size",
            "1",
            "--dtype",
            "bfloat16",
            "--gpu-memory-utilization",
            "0.5",
            "--max-model-len",
            "512",
        ]
    )
    assert not unknown, says(rl_servers, "trl", f"`trl vllm-serve` does not know {unknown}")
    cli = Path(importlib.util.find_spec("transformers.cli").submodule_search_locations[0])
    assert 'name="serve"' in (cli / "transformers.py").read_text(encoding="utf-8"), says(
        rl_servers, "transformers", "`transformers serve` is no longer a command of transformers.cli.transformers"
    )
    serve = next(
        (
            node
            for node in ast.walk(ast.parse((cli / "serve.py").read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef) and node.name == "Serve"
        ),
        None,
    )
    init = next(
        (node for node in getattr(serve, "body", []) if isinstance(node, ast.FunctionDef) and node.name == "__init__"),
        None,
    )
    options = {arg.arg for arg in init.args.args + init.args.kwonlyargs} if init is not None else set()
    assert {"host", "port", "device", "dtype"} <= options, says(
        rl_servers, "transformers", (f"`transformers serve` takes {sorted(options)}")
    )
    if importlib.util.find_spec("vllm") is not None:  # (the [vllm] extra)
        assert importlib.util.find_spec(rl_servers.VLLM_CLI[1]) is not None, says(rl_servers, "vllm", "no vLLM CLI")
