"""GRPO recipe: TRL's GRPOTrainer on prompts the driver rendered with the model's chat template.

Read top-down: arguments -> data -> tokenizer + model -> rewards (built-in, custom, judge) -> trainer ->
train, evaluate, save. Rollouts: vLLM (colocated in each worker, or the driver's `trl vllm-serve`), or
transformers' generation with `use_vllm: false`.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import METHODS
from leap_finetune.recipes import common
from leap_finetune.recipes.failures import saved_so_far
from leap_finetune.runs.folder import RunFolder

SAMPLES_PER_LOG = 4  # completions written to completions.jsonl at each log step


def config_class():
    """The training arguments of this type (methods/ names the class)."""
    return METHODS["grpo"].arguments_class()


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    args = common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)
    if resolved.rewards is not None:
        from leap_finetune.validate.grpo import reward_weights

        args["reward_weights"] = reward_weights(resolved.rewards)
    if args.get("vllm_server_host") == "auto":
        # the node the driver runs on: where it starts the rollout server
        args["vllm_server_host"] = socket.gethostname()
    rollout = resolved.grpo_rollout
    if rollout is not None and args.get("vllm_mode") == "server":
        args.setdefault("vllm_server_timeout", rollout.server_start_timeout_s)
    return args


def reward_functions(resolved: ResolvedConfig, judge_url: str | None = None, tokenizer=None) -> list:
    from leap_finetune.rl.judge import Judge
    from leap_finetune.rl.rewards import build_reward

    where = resolved.config_path or "config"
    # a custom reward that fails stops the run where it is (the step is not finished: nothing to save); the
    # checkpoints saved before are complete
    then = (lambda: saved_so_far(Path(resolved.run_dir))) if resolved.run_dir else None
    functions = [
        build_reward(spec, where=f"{where}: rewards.funcs[{index}]", then=then, tokenizer=tokenizer)
        for index, spec in enumerate(resolved.rewards.funcs)
    ]
    judge = resolved.rewards.judge
    if judge is not None:
        functions.append(Judge(judge, judge.base_url or judge_url))
    return functions


def trainer_class():
    from trl import GRPOTrainer

    from leap_finetune.recipes.host_syncs import score_trained_tokens_only_on_cpu

    score_trained_tokens_only_on_cpu()  # (the prompt's positions: no log-prob needed)

    from leap_finetune.recipes.vision import VisionRate

    class LeapGRPOTrainer(VisionRate, GRPOTrainer):
        """TRL's GRPOTrainer, plus: without vLLM, rollouts through leap-finetune's decoding loop (rl/sampler.py:
        a static cache, the step compiled into a CUDA graph on a GPU) wherever it samples what generate would;
        the rollout speed is logged (`rollout/tokens_per_s`); a few completions with their rewards go to
        completions.jsonl at each log step."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._rollout_tokens, self._rollout_seconds = 0, 0.0
            self._sampler = None
            self._environment = None  # environment: (recipes/grpo_episodes.py attaches it)
            self.rollout_engine, self.rollout_why_not = _rollout_engine(self)

        def _generate_and_score_completions(self, inputs):
            self._episode_rows = inputs  # (an environment's reset(row) reads the batch's rows)
            return super()._generate_and_score_completions(inputs)

        def _generate(self, prompts):
            out = super()._generate(prompts)
            if self._environment is None:
                return out
            from leap_finetune.recipes.grpo_episodes import after_generate

            return (*out[:3], after_generate(self, out[3]), *out[4:])

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if self._environment is not None:
                from leap_finetune.recipes.grpo_episodes import after_rewards

                after_rewards(self, prompts, rewards)
            return rewards

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            import time

            import torch

            start = time.perf_counter()
            if self.rollout_engine.startswith("leap-finetune sampler"):  # (pictures: their pixels in the prefill)
                completion_ids, logprobs = self._sample(prompt_ids, pictures=multimodal_fields)
            else:
                completion_ids, logprobs = super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
            if torch.cuda.is_available() and self.accelerator.device.type == "cuda":
                torch.cuda.synchronize()
            self._rollout_seconds += time.perf_counter() - start
            self._rollout_tokens += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

        def _sample(
            self, prompt_ids, max_new: int | None = None, pictures: dict | None = None
        ) -> tuple[list[list[int]], list[list[float]]]:
            return _sample(self, prompt_ids, max_new or self.max_completion_length, pictures)

        def log(self, logs, start_time=None):
            if self.model.training and self._rollout_seconds > 0:
                # completion tokens per second of generation on this process since the last log (rank 0 logs;
                # with vLLM the weight sync before generating is included)
                logs["rollout/tokens_per_s"] = round(self._rollout_tokens / self._rollout_seconds, 1)
                self._rollout_tokens, self._rollout_seconds = 0, 0.0
            super().log(logs, start_time)
            if self.accelerator.is_main_process and self.model.training and self._logs["prompt"]:
                _write_completions(self)

    return LeapGRPOTrainer


def _rollout_engine(trainer) -> tuple[str, str | None]:
    """What samples the rollouts (vLLM, leap-finetune's sampler, transformers' generate) and, when it is not the
    sampler without vLLM, why not."""
    engine, why = "vllm" if trainer.use_vllm else "transformers generate", None
    sharded = trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
    if sharded:
        why = "FSDP or DeepSpeed (generate gathers the sharded weights)"
    elif not trainer.use_vllm and not trainer.use_transformers_continuous_batching:
        from trl.models import unwrap_model_for_generation

        from leap_finetune.rl.sampler import why_not

        # leap-finetune's decoding loop (rl/sampler.py) wherever it samples what generate would sample
        # (asked with TRL's generation settings applied to the model, as during a rollout)
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs
        ) as model:
            why = why_not(model, trainer.generation_config, multimodal=trainer._is_vlm)
        cuda = trainer.accelerator.device.type == "cuda"
        if why is None:
            engine = "leap-finetune sampler" + (" (CUDA graphs)" if cuda else "")
        elif trainer.generation_config.cache_implementation == "static" and cuda and not sharded:
            # TRL builds its GenerationConfig with disable_compile=True; with a static cache transformers
            # then compiles its one-token decoding step (CUDA graphs) - 3.6x TRL's default (bench/NOTES.md)
            trainer.generation_config.disable_compile = False
    return engine, why


def _pixels(trainer, pictures: dict | None, device) -> dict:
    """The processor's image fields of the prompts (pixel values, their masks and shapes) as the prefill takes
    them, built as TRL builds them for generate."""
    import numpy as np
    import torch

    fields = {}
    for key, value in (pictures or {}).items():
        fields[key] = value if isinstance(value, torch.Tensor) else torch.tensor(np.array(value))
    return {key: value.to(device) for key, value in fields.items()}


def _sample(
    trainer, prompt_ids, max_new: int, pictures: dict | None = None
) -> tuple[list[list[int]], list[list[float]]]:
    """TRL's transformers path (left padding, completions cut after the first end token) with
    rl/sampler.py's loop in place of generate; with each token's sampling log-probability, as vLLM returns
    it (TRL's off-policy sequence mask, `off_policy_mask_threshold`, then reads the sampler's own). `pictures`:
    the prompts' image fields (GRPO on pictures), read by the prefill."""
    import torch
    from trl.extras.profiling import profiling_context
    from trl.models import unwrap_model_for_generation
    from trl.trainer.utils import pad

    from leap_finetune.rl.sampler import Sampler

    device = trainer.accelerator.device
    tensors = [torch.tensor(ids) for ids in prompt_ids]
    input_ids = pad(
        tensors,
        padding_value=trainer._tokenizer.pad_token_id,
        padding_side="left",
        pad_to_multiple_of=trainer.pad_to_multiple_of,
    ).to(device)
    attention_mask = pad(
        [torch.ones_like(t) for t in tensors],
        padding_value=0,
        padding_side="left",
        pad_to_multiple_of=trainer.pad_to_multiple_of,
    ).to(device)
    with (
        profiling_context(trainer, "transformers.generate"),
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
    ):
        if trainer._sampler is None or trainer._sampler.model is not model:
            cuda = device.type == "cuda"
            # on a GPU: decode with a bf16 copy refreshed every rollout (rl/sampler.py); not fp16 (LFM2's
            # activations can overflow it without autocast's fp32 residual stream)
            half = torch.bfloat16 if trainer.args.bf16 else None
            trainer._sampler = Sampler(
                model,
                trainer.generation_config,
                list(trainer.eos_token_ids),
                trainer._tokenizer.pad_token_id,
                compile=cuda,
                rollout_dtype=half if cuda else None,
            )
        completions, logps = trainer._sampler.generate(
            input_ids, attention_mask, max_new, logprobs=True, prefill=_pixels(trainer, pictures, device)
        )
    is_eos = torch.isin(completions, torch.tensor(trainer.eos_token_ids, device=device))
    ends = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), completions.size(1)).cpu().tolist()
    completions, logps = completions.cpu(), logps.cpu()
    return (
        [row[: end + 1].tolist() for row, end in zip(completions, ends, strict=True)],
        [row[: end + 1].tolist() for row, end in zip(logps, ends, strict=True)],
    )


def _write_completions(trainer) -> None:
    """A few of the step's completions with their rewards and advantage, appended to completions.jsonl."""
    logged = trainer._logs
    count = min(SAMPLES_PER_LOG, len(logged["prompt"]))
    with RunFolder(trainer.args.output_dir).completions.open("a", encoding="utf-8") as handle:
        if trainer._environment is not None:  # (episodes: turns, calls, tool results, final answer, rewards)
            for entry in trainer._episodes_logged:
                handle.write(json.dumps({"step": trainer.state.global_step, **entry}, ensure_ascii=False) + "\n")
            trainer._episodes_logged.clear()
            return
        for i in range(count):
            rewards = {name: values[i] for name, values in logged["rewards"].items() if i < len(values)}
            entry = {
                "step": trainer.state.global_step,
                "prompt": logged["prompt"][i],
                "completion": logged["completion"][i],
                "rewards": rewards,
                "advantage": logged["advantages"][i],
            }
            handle.write(json.dumps(entry, ensure_ascii=False, default=_as_text) + "\n")


def _as_text(value) -> str:
    """What JSON cannot hold in a logged prompt: a picture (GRPO on images) is written as its place, `<image>`."""
    return "<image>" if type(value).__module__.startswith("PIL") else str(value)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    start = common.start_worker(resolved_json, config_class(), training_arguments)
    resolved, run_dir, console, args = start.resolved, start.run_dir, start.console, start.args
    train_dataset, eval_dataset = start.train_dataset, start.eval_dataset
    tokenizer, model = common.load_tokenizer_and_model(resolved, packing=False, console=console)
    from leap_finetune.recipes.callbacks import StopOnSignal
    from leap_finetune.rl.judge import judge_totals, judge_watch, judges

    stop_on_signal = StopOnSignal()
    watch = judge_watch(stop_on_signal)
    trainer_cls, processing_class = trainer_class(), tokenizer
    if resolved.vision:  # prompts with pictures: TRL renders them with the processor (recipes/grpo_images.py)
        from leap_finetune.recipes import grpo_images, vision

        train_dataset, eval_dataset = grpo_images.with_images(train_dataset), grpo_images.with_images(eval_dataset)
        processing_class = grpo_images.processor_for(resolved, tokenizer)
        vision.prepare_vision_model(resolved, model, console)
        trainer_cls.vision_lr_multiplier = resolved.training.get("vision_encoder_lr_multiplier")
    trainer = trainer_cls(
        model=common.with_adapter(resolved, model),
        reward_funcs=reward_functions(resolved, judge_url=resolved.judge_url, tokenizer=tokenizer),
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processing_class,
        peft_config=common.lora_config(resolved),
        callbacks=common.standard_callbacks(
            resolved,
            run_dir,
            console,
            stop_on_signal,
            [watch, *(callbacks or [])],
            common.benchmark_callback(resolved, tokenizer, run_dir, console),
        ),
    )
    watch.judges = judges(trainer)
    common.adapter_reference(trainer, resolved)
    if resolved.vision:
        grpo_images.vllm_names_in_published_layout(trainer)
    if resolved.environment is not None:
        from leap_finetune.recipes import grpo_episodes

        grpo_episodes.attach(trainer, resolved, tokenizer)
    if trainer.accelerator.is_main_process:
        console.print(
            f"rollouts: {trainer.rollout_engine}" + (f" ({trainer.rollout_why_not})" if trainer.rollout_why_not else "")
        )

    def after_training(trainer) -> dict:
        """The judge's requests and failures over every rank; a judge that stopped the run is its error."""
        rollouts = {"rollouts": {"engine": trainer.rollout_engine, "why_not_sampler": trainer.rollout_why_not}}
        if trainer._sampler is not None and trainer._sampler.compile_error:
            rollouts["rollouts"]["compile_error"] = trainer._sampler.compile_error  # (decoded without CUDA graphs)
        totals = judge_totals(trainer)
        if totals is None:
            return rollouts
        if resolved.resume_checkpoint_path:  # (this process's requests: the report says since when)
            from leap_finetune.runs.checkpoints import step_of

            totals["since_step"] = step_of(Path(resolved.resume_checkpoint_path))
        extra = {"judge": totals, **rollouts}
        if watch.stopped and trainer.state.global_step < trainer.state.max_steps:  # (at the last step: finished)
            extra["error"] = {
                "message": f"{totals['stop_reason'] or 'the judge failed every request'}; the run saved a "
                "checkpoint and stopped",
                "where": f"{resolved.config_path or 'config'}: rewards.judge",
                "fix": "fix or restart the judge server (its log: servers/judge_server.log for a local "
                "judge), then resume with resume_from_checkpoint: latest; "
                "rewards.judge.max_failed_steps: 0 trains on without it",
            }
        return extra

    try:
        return common.train_evaluate_save(
            trainer, resolved, run_dir, tokenizer, console, stop_on_signal, [], after_training=after_training
        )
    finally:
        from leap_finetune.recipes.grpo_episodes import close

        close(trainer)
