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
from leap_finetune.recipes import common
from leap_finetune.recipes.callbacks import StopOnSignal

SAMPLES_PER_LOG = 4  # completions written to completions.jsonl at each log step


def config_class():
    from trl import GRPOConfig

    return GRPOConfig


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    args = common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)
    if resolved.rewards is not None:
        from leap_finetune.config.grpo import reward_weights

        args["reward_weights"] = reward_weights(resolved.rewards)
    if args.get("vllm_server_host") == "auto":
        # the node the driver runs on: where it starts the rollout server
        args["vllm_server_host"] = socket.gethostname()
    rollout = resolved.grpo_rollout
    if rollout is not None and args.get("vllm_mode") == "server":
        args.setdefault("vllm_server_timeout", rollout.server_start_timeout_s)
    return args


def reward_functions(resolved: ResolvedConfig, judge_url: str | None = None) -> list:
    from leap_finetune.rl.judge import Judge
    from leap_finetune.rl.rewards import build_reward

    where = resolved.config_path or "config"
    # a custom reward that fails stops the run where it is (the step is not finished: nothing to save); the
    # checkpoints saved before are complete
    then = (lambda: common._saved_so_far(Path(resolved.run_dir))) if resolved.run_dir else None
    functions = [build_reward(spec, where=f"{where}: rewards.funcs[{index}]", then=then)
                 for index, spec in enumerate(resolved.rewards.funcs)]
    judge = resolved.rewards.judge
    if judge is not None:
        functions.append(Judge(judge, judge.base_url or judge_url))
    return functions


def trainer_class():
    from trl import GRPOTrainer

    class LeapGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer, plus: rollouts with transformers' generate on a GPU decode through a compiled
        step when the cache is static (DEFAULT_GRPO); the rollout speed is logged (`rollout/tokens_per_s`);
        a few completions with their rewards go to completions.jsonl at each log step."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._rollout_tokens, self._rollout_seconds = 0, 0.0
            if (not self.use_vllm and not self.use_transformers_continuous_batching
                    and self.generation_config.cache_implementation == "static"
                    and self.accelerator.device.type == "cuda"
                    and not self.is_fsdp_enabled and not self.is_deepspeed_enabled):  # sharded: not measured
                # TRL builds its GenerationConfig with disable_compile=True. With a static cache, transformers
                # compiles the one-token decoding step (CUDA graphs): the decode loop stops being bound by
                # Python and kernel launches (bench/grpo_rollout.py measures it against TRL's default).
                self.generation_config.disable_compile = False

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            import time

            import torch

            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            if torch.cuda.is_available() and self.accelerator.device.type == "cuda":
                torch.cuda.synchronize()
            self._rollout_seconds += time.perf_counter() - start
            self._rollout_tokens += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

        def log(self, logs, start_time=None):
            if self.model.training and self._rollout_seconds > 0:
                # completion tokens per second of generation on this process since the last log (rank 0 logs;
                # with vLLM the weight sync before generating is included)
                logs["rollout/tokens_per_s"] = round(self._rollout_tokens / self._rollout_seconds, 1)
                self._rollout_tokens, self._rollout_seconds = 0, 0.0
            super().log(logs, start_time)
            if not self.accelerator.is_main_process or not self.model.training or not self._logs["prompt"]:
                return
            count = min(SAMPLES_PER_LOG, len(self._logs["prompt"]))
            with (Path(self.args.output_dir) / "completions.jsonl").open("a", encoding="utf-8") as handle:
                for i in range(count):
                    rewards = {name: values[i] for name, values in self._logs["rewards"].items() if i < len(values)}
                    handle.write(json.dumps({"step": self.state.global_step, "prompt": self._logs["prompt"][i],
                                             "completion": self._logs["completion"][i], "rewards": rewards,
                                             "advantage": self._logs["advantages"][i]}) + "\n")

    return LeapGRPOTrainer


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    from rich.console import Console

    resolved = ResolvedConfig.model_validate(resolved_json)
    common.quiet_libraries()
    run_dir = Path(resolved.run_dir)
    console = Console(stderr=True)

    train_dataset, eval_dataset = common.load_prepared(run_dir)
    args = config_class()(**training_arguments(resolved, run_dir=str(run_dir), has_eval=eval_dataset is not None))
    tokenizer, model = common.load_tokenizer_and_model(resolved, packing=False, console=console)
    from leap_finetune.rl.judge import judge_totals, judge_watch, judges

    stop_on_signal = StopOnSignal()
    watch = judge_watch(stop_on_signal)
    trainer = trainer_class()(
        model=model,
        reward_funcs=reward_functions(resolved, judge_url=resolved.judge_url),
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=common.lora_config(resolved),
        callbacks=common.standard_callbacks(resolved, run_dir, console, stop_on_signal, [watch, *(callbacks or [])],
                                            common.benchmark_callback(resolved, tokenizer, run_dir, console)),
    )
    watch.judges = judges(trainer)

    def after_training(trainer) -> dict:
        """The judge's requests and failures over every rank; a judge that stopped the run is its error."""
        totals = judge_totals(trainer)
        if totals is None:
            return {}
        if resolved.resume_checkpoint_path:  # (this process's requests: the report says since when)
            from leap_finetune.recipes.checkpoints import step_of

            totals["since_step"] = step_of(Path(resolved.resume_checkpoint_path))
        extra = {"judge": totals}
        if watch.stopped and trainer.state.global_step < trainer.state.max_steps:  # (at the last step: finished)
            extra["error"] = {"message": f"{totals['stop_reason'] or 'the judge failed every request'}; the run saved a "
                                         "checkpoint and stopped",
                              "where": f"{resolved.config_path or 'config'}: rewards.judge",
                              "fix": "fix or restart the judge server (its log: servers/judge_server.log for a local "
                                     "judge), then resume with resume_from_checkpoint: latest; "
                                     "rewards.judge.max_failed_steps: 0 trains on without it"}
        return extra

    return common.train_evaluate_save(trainer, resolved, run_dir, tokenizer, console, stop_on_signal, [],
                                      after_training=after_training)
