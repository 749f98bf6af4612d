"""`metric: episodes`: a benchmark whose rows are played as multi-turn tool episodes in the config's `environment:`
(rl/episodes.py, the same loop as GRPO's rollouts, greedy unless `evals.do_sample`), scored by the share of episodes
whose final answer the `accuracy` reward counts right. Rows are GRPO rows (`prompt` + `solution`, or `messages`
whose last assistant turn is the solution; every other column goes to the environment's `reset(row)`), so a GRPO
run's `val_path` file is a benchmark as it is.

It runs where the model is in this process: `leap-finetune eval` (without --server: a server answers one turn at a
time, and the calls must run here) and benchmarks during training with async_eval mode sync. The tools run in
worker processes started for the benchmark and stopped after it.
"""

from __future__ import annotations

import os

from leap_finetune.errors import LeapError


def run_episode_benchmark(model, renderer, evals, bench, environment: dict | None) -> tuple[dict, list[dict]]:
    """(metrics, predictions): score (success), answered, turns, calls, tool_error_rate, parse_failures, rows."""
    if environment is None:
        raise LeapError(
            f"benchmark '{bench.name}' (metric episodes) plays its rows in the config's environment, and this "
            "config has none",
            where=f"evals.benchmarks ('{bench.name}')",
            fix="add environment: {tools: ./tools.py} (docs/agents.md), or use another metric",
        )
    from leap_finetune.models.loading import end_token_ids
    from leap_finetune.rl.episodes import ToolTurns, run_episodes
    from leap_finetune.rl.rewards import accuracy
    from leap_finetune.rl.tool_specs import ToolSource
    from leap_finetune.rl.tool_workers import ToolWorkers

    schemas = environment["schemas"]
    prompts = [renderer.prompt_text(item.prompt, schemas) for item in bench.items]
    tokenizer = renderer.tokenizer
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    rows = [{**item.extra, "solution": item.reference, "prompt_text": p} for item, p in zip(bench.items, prompts)]
    workers = ToolWorkers(
        ToolSource.from_json(environment["source"]),
        workers=environment["workers"] or min(8, os.cpu_count() or 1),
        timeout=environment["tool_timeout"],
        memory_mb=environment["tool_memory_mb"],
        max_chars=environment["max_result_chars"],
    )
    eos = end_token_ids(tokenizer)
    try:
        episodes = []
        for start in range(0, len(prompt_ids), evals.batch_size):
            episodes += run_episodes(
                prompt_ids[start : start + evals.batch_size],
                rows[start : start + evals.batch_size],
                generate=lambda ids, max_new: _generate(model, tokenizer, ids, max_new, evals, eos),
                workers=workers,
                schemas=schemas,
                tool_turns=ToolTurns(renderer),
                eos_ids=eos,
                max_turns=environment["max_turns"],
                budget=evals.max_new_tokens,
            )
    finally:
        workers.close()
    scores = accuracy([e.final_answer for e in episodes], [item.reference for item in bench.items])
    return _metrics(episodes, scores), _predictions(bench.items, prompts, episodes, scores)


def _generate(model, tokenizer, prompt_ids: list[list[int]], max_new: int, evals, eos: list[int]):
    """One turn for each running episode: left-padded batch, cut after the first end token."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(ids) for ids in prompt_ids)
    inputs = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=device)
    kwargs = {"do_sample": evals.do_sample}
    if evals.do_sample:
        kwargs.update(temperature=evals.temperature, top_p=evals.top_p)
    with torch.no_grad():
        out = model.generate(
            input_ids=inputs, attention_mask=mask, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad, **kwargs
        )
    turns = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        turns.append(row[:end])
    return turns, None


def _metrics(episodes, scores: list) -> dict:
    count = len(episodes)
    calls = sum(e.calls for e in episodes)
    return {
        "score": sum(s or 0.0 for s in scores) / count,
        "answered": sum(1 for e in episodes if e.final_answer) / count,
        "turns": sum(e.turns for e in episodes) / count,
        "calls": calls / count,
        "tool_error_rate": sum(e.tool_errors for e in episodes) / calls if calls else 0.0,
        "parse_failures": sum(e.parse_failures for e in episodes),
        "rows": count,
    }


def _predictions(items, prompts, episodes, scores) -> list[dict]:
    return [
        {
            "source": f"{item.file}, {item.location}",
            "prompt": prompt,
            "episode": episode.messages,
            "prediction": episode.final_answer,
            "ended": episode.ended,
            "reference": item.reference,
            "score": score or 0.0,
        }
        for item, prompt, episode, score in zip(items, prompts, episodes, scores, strict=True)
    ]
