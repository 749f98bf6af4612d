"""GRPO with an `environment:` - TRL's GRPOTrainer given multi-turn episodes (rl/episodes.py) through its rollout
hook: the episode's tokens as the completion, `env_mask` keeping the tool turns out of the loss (TRL multiplies it
into the loss mask, as for its own tool loop), the episode's messages as the `episode` column of the reward functions,
and the final answer as the completion text the rewards score.

Why not TRL's own tool loop (`tools=` / `environment_factory=`): it parses calls with the tokenizer's response schema
(none for LFM2), runs tools in the training process (a hanging tool hangs the run), and tokenizes prompts from
messages, where leap-finetune's GRPO prompts are rendered by the driver. The turns here are sampled by the run's
rollout engine: leap-finetune's sampler, or TRL's vLLM / transformers path (`_generate_single_turn`).
"""

from __future__ import annotations

import os
from collections import deque

from leap_finetune.config.resolved import ResolvedConfig

EPISODES_LOGGED = 4  # episodes kept for completions.jsonl at each log step


def attach(trainer, resolved: ResolvedConfig, tokenizer) -> None:
    """Give the trainer its tool workers and its rollout hook (TRL's `rollout_func`)."""
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.data.render import Renderer
    from leap_finetune.rl.episodes import ToolTurns
    from leap_finetune.rl.tool_specs import ToolSource
    from leap_finetune.rl.tool_workers import ToolWorkers

    environment = resolved.environment
    renderer = Renderer(tokenizer, load_chat_template(resolved.chat_template, tokenizer), "all", None)
    trainer._tool_turns = ToolTurns(renderer)
    trainer._tool_workers = ToolWorkers(
        ToolSource.from_json(environment["source"]),
        workers=environment["workers"] or min(8, os.cpu_count() or 1),
        timeout=environment["tool_timeout"],
        memory_mb=environment["tool_memory_mb"],
        max_chars=environment["max_result_chars"],
    )
    trainer._environment = environment
    if environment.get("augment_tools"):
        _check_augmentable(renderer, environment["schemas"])
        import random

        trainer._augment_rng = random.Random(resolved.training.get("seed", 42))
    trainer._episodes = []
    trainer._episodes_logged = deque(maxlen=EPISODES_LOGGED)
    # (set after TRL's __init__: given to it, it would warn that the hook is experimental on every run)
    trainer.rollout_func = rollout


def _check_augmentable(renderer, schemas: list[dict]) -> None:
    from leap_finetune.data.tool_disguise import tool_list_text
    from leap_finetune.errors import LeapError

    if tool_list_text(schemas) not in renderer.prompt_text([{"role": "user", "content": "q"}], schemas):
        raise LeapError(
            "environment.augment_tools: this chat template does not write the tool list as the definitions' JSON, so "
            "the tools shown to an episode cannot be swapped",
            where="environment.augment_tools",
            fix="use the model family's template (chat_template: lfm2 or lfm2.5), or set augment_tools: false",
        )


def rollout(prompts: list, trainer) -> dict:
    """TRL's rollout hook: one episode per prompt (the rows are the batch's, kept by _generate_and_score_completions)."""
    from leap_finetune.rl.episodes import run_episodes

    prompts, views = _shown_tools(trainer, prompts)
    trainer._shown_prompts = prompts if views else None  # (completions.jsonl shows what the model was shown)
    prompt_ids = trainer.processing_class(text=prompts)["input_ids"]  # (as TRL tokenizes text prompts)
    rows = [{k: v for k, v in row.items() if k != "prompt"} for row in trainer._episode_rows]
    environment, timing = trainer._environment, {}
    episodes = run_episodes(
        prompt_ids,
        rows,
        generate=lambda ids, max_new: generate_turn(trainer, ids, max_new),
        workers=trainer._tool_workers,
        schemas=environment["schemas"],
        tool_turns=trainer._tool_turns,
        eos_ids=list(trainer.eos_token_ids),
        max_turns=environment["max_turns"],
        budget=trainer.max_completion_length,
        timing=timing,
        views=views,
    )
    trainer._episodes, trainer._episode_timing = episodes, timing
    logprobs = [e.logprobs for e in episodes]
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
        "env_mask": [e.mask for e in episodes],
        "episode": [e.messages for e in episodes],
    }


def _shown_tools(trainer, prompts: list) -> tuple[list, list | None]:
    """environment.augment_tools, in training: each episode's prompt with its own view of the tools."""
    environment = trainer._environment
    if not environment.get("augment_tools") or not trainer.model.training:
        return prompts, None
    from leap_finetune.data.tool_disguise import augment, shown_prompt

    views = [augment(environment["schemas"], trainer._augment_rng) for _ in prompts]
    return [shown_prompt(p, environment["schemas"], v) for p, v in zip(prompts, views, strict=True)], views


def generate_turn(trainer, prompt_ids: list[list[int]], max_new: int):
    """One turn for each running episode, by the run's rollout engine; cut after the first end token."""
    if trainer.rollout_engine.startswith("leap-finetune sampler"):
        return trainer._sample(prompt_ids, max_new)
    ids, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, num_generations=1)
    ends = set(trainer.eos_token_ids)
    cut = [next((i + 1 for i, t in enumerate(row) if t in ends), len(row)) for row in ids]
    ids = [list(row[:n]) for row, n in zip(ids, cut, strict=True)]
    if logprobs is not None:
        logprobs = [list(row[:n]) for row, n in zip(logprobs, cut, strict=True)]
    return ids, logprobs


def after_generate(trainer, completions: list) -> list:
    """The completion texts the rewards score: each episode's final answer ("" when it ended without one), and the
    episode metrics of this batch."""
    episodes = trainer._episodes
    if not episodes:
        return completions
    _log_metrics(trainer, episodes)
    return [e.final_answer for e in episodes]


def _log_metrics(trainer, episodes) -> None:
    import torch

    mode = "train" if trainer.model.training else "eval"
    device = trainer.accelerator.device
    per_episode = torch.tensor(
        [[e.turns, e.calls, e.parse_failures, e.tool_errors, e.tool_seconds] for e in episodes],
        dtype=torch.float64,
        device=device,
    )
    gathered = trainer.accelerator.gather(per_episode)
    means = gathered.mean(dim=0).tolist()
    calls = gathered[:, 1].sum().item()
    metrics = trainer._metrics[mode]
    metrics["episodes/turns"].append(means[0])
    metrics["episodes/calls"].append(means[1])
    metrics["episodes/parse_failures"].append(means[2])
    metrics["episodes/tool_error_rate"].append(gathered[:, 3].sum().item() / calls if calls else 0.0)
    metrics["episodes/tool_seconds"].append(means[4])
    timing = getattr(trainer, "_episode_timing", {})
    metrics["episodes/generate_seconds"].append(timing.get("generate_s", 0.0))
    metrics["episodes/tools_wall_seconds"].append(timing.get("tools_s", 0.0))
    answered = torch.tensor([1.0 if e.final_answer else 0.0 for e in episodes], device=device)
    metrics["episodes/answered"].append(trainer.accelerator.gather(answered).mean().item())


def after_rewards(trainer, prompts: list, rewards_per_func) -> None:
    """episodes/success - the share of episodes whose final answer the `accuracy` reward counts right (rows with a
    solution) - and a few episodes kept with their rewards for completions.jsonl."""
    import torch

    names = list(trainer.reward_func_names)
    if not trainer._episodes:
        return
    if "accuracy" in names:
        column = rewards_per_func[:, names.index("accuracy")]
        scored = column[~torch.isnan(column)]
        if scored.numel():
            mode = "train" if trainer.model.training else "eval"
            trainer._metrics[mode]["episodes/success"].append(scored.mean().item())
    first = trainer.accelerator.process_index * len(prompts)  # (rewards_per_func holds every process's rows)
    for i, episode in enumerate(trainer._episodes[:EPISODES_LOGGED]):
        values = [float(rewards_per_func[first + i, j]) for j in range(len(names))]
        rewards = {name: (None if v != v else v) for name, v in zip(names, values, strict=True)}  # (NaN: unscored)
        trainer._episodes_logged.append(
            {
                "prompt": (getattr(trainer, "_shown_prompts", None) or prompts)[i],
                "episode": episode.messages,
                "completion": episode.final_answer,
                "rewards": rewards,
            }
        )


def close(trainer) -> None:
    workers = getattr(trainer, "_tool_workers", None)
    if workers is not None:
        workers.close()
