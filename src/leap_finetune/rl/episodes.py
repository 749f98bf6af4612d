"""Multi-turn GRPO rollouts: the model calls tools, sees their results, and answers - one episode per completion.

An episode's completion is every token after the prompt: the model's own turns and, between them, the tool turns
exactly as the chat template renders them ("glue": `<|im_start|>tool\\n<|tool_response_start|>...` for LFM2, no
response markers for LFM2.5, then the next `<|im_start|>assistant\\n`). The model's tokens are kept as sampled (never
decoded and encoded again); the glue is the template's rendering of the tool messages, tokenized, cut after the end
of the assistant's turn. Only the model's tokens carry loss and advantage: `mask` is 1 on them and 0 on the glue (TRL
multiplies it into the loss mask, as for its own tool loop).

Episodes are batched: each turn, every episode still running generates at once (one call of the rollout engine),
then the calls of all of them run in the tool workers at once. The completion budget (`max_completion_length`) is
the episode's: model tokens and tool turns together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from leap_finetune.data import tool_calls as tc
from leap_finetune.data.tool_disguise import ToolView, identity
from leap_finetune.errors import LeapError
from leap_finetune.rl.tool_specs import call_problem
from leap_finetune.rl.tool_workers import Outcome, ToolWorkers

# why an episode ended
ANSWERED, MAX_TURNS, BUDGET = "answered", "max_turns", "budget"


@dataclass
class Episode:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1: the model's token (trained), 0: a tool turn's (not)
    logprobs: list[float] | None = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)  # the assistant and tool turns after the prompt
    final_answer: str = ""  # the last turn's text when the episode ended with an answer (no call), else ""
    calls: int = 0
    parse_failures: int = 0  # turns whose tool call did not parse
    tool_errors: int = 0  # calls that parsed but failed (undeclared tool, bad arguments, exception, timeout)
    tool_seconds: float = 0.0
    ended: str = ""

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def add(self, ids: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.mask += [1 if trained else 0] * len(ids)
        if self.logprobs is not None:
            self.logprobs = None if (trained and logprobs is None) else self.logprobs + (logprobs or [0.0] * len(ids))


class ToolTurns:
    """The tokens of tool turns as the chat template renders them, between an assistant turn's end token and the
    next assistant turn's first token."""

    def __init__(self, renderer):
        self.renderer = renderer
        self.eos = renderer.tokenizer.eos_token
        dummy = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        head, _ = renderer.render(dummy)
        if not self.eos or self.eos not in head:
            raise LeapError(
                "the chat template does not end an assistant turn with the tokenizer's end token "
                f"({self.eos!r}), so the tool turns that follow one cannot be found",
                where="chat_template",
                fix="use the model family's template (chat_template: lfm2 or lfm2.5)",
            )
        self.dummy, self.head = dummy, head[: head.rindex(self.eos) + len(self.eos)]

    def text(self, tool_messages: list[dict]) -> str:
        full = self.renderer.prompt_text(self.dummy + tool_messages)
        if not full.startswith(self.head):
            raise LeapError(
                "the chat template renders the assistant turn differently when tool turns follow it",
                where="chat_template",
                fix="use the model family's template (chat_template: lfm2 or lfm2.5)",
            )
        return full[len(self.head) :]

    def ids(self, tool_messages: list[dict]) -> list[int]:
        return self.renderer.tokenizer(self.text(tool_messages), add_special_tokens=False)["input_ids"]


def _assistant_turn(episode: Episode, ids: list[int], tokenizer, eos_ids: set) -> tc.ToolCallBlocks | None:
    """Record the sampled turn; the calls it makes (None when it makes none)."""
    ended = bool(ids) and ids[-1] in eos_ids
    body = ids[:-1] if ended else ids
    text = tokenizer.decode(body, skip_special_tokens=False)
    blocks = tc.find_tool_calls(text) if (tc.CALL_START in text or tc.CALL_END in text) else None
    message = {"role": "assistant", "content": text}
    if blocks is not None and blocks.calls:
        message["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in blocks.calls]
    episode.messages.append(message)
    if blocks is None and ended:
        episode.final_answer = tokenizer.decode(body, skip_special_tokens=True)
    return blocks if ended else None


def run_episodes(
    prompt_ids: list[list[int]],
    rows: list[dict],
    *,
    generate: Callable,
    workers: ToolWorkers,
    schemas: list[dict],
    tool_turns: ToolTurns,
    eos_ids: list[int],
    max_turns: int,
    budget: int,
    timing: dict | None = None,
    views: list[ToolView] | None = None,
) -> list[Episode]:
    """One episode per prompt. `generate(list of token lists, max_new_tokens) -> (token lists, logprob lists or
    None)` samples one turn for each (cut after the end token); `rows` start the environments (reset(row)).
    `timing` (a dict) gets the wall seconds of generation and of the tools added to its "generate_s" / "tools_s".
    `views`: per episode, the tools as its prompt shows them (environment.augment_tools); default the real ones."""
    views = views or [identity(schemas)] * len(prompt_ids)
    timing = timing if timing is not None else {}
    episodes = [Episode(list(ids)) for ids in prompt_ids]
    errors = workers.reset(rows)
    failed = next((i for i, e in enumerate(errors) if e), None)
    if failed is not None:
        workers.end()
        raise LeapError(
            f"the environment could not start an episode: {errors[failed]}",
            where="environment.tools",
            fix="correct reset(self, row) for this row: " + repr(rows[failed])[:300],
        )
    tokenizer, ends = tool_turns.renderer.tokenizer, set(eos_ids)
    try:
        for turn in range(max_turns):
            running = [i for i, e in enumerate(episodes) if not e.ended]
            if not running:
                break
            rooms = [budget - len(episodes[i].completion_ids) for i in running]
            start = time.perf_counter()
            new_ids, new_logps = generate(
                [episodes[i].prompt_ids + episodes[i].completion_ids for i in running], max(rooms)
            )
            timing["generate_s"] = timing.get("generate_s", 0.0) + time.perf_counter() - start
            waiting = []
            for slot, (index, room) in enumerate(zip(running, rooms, strict=True)):
                episode, ids = episodes[index], list(new_ids[slot])[:room]
                episode.add(ids, True, None if new_logps is None else list(new_logps[slot])[: len(ids)])
                blocks = _assistant_turn(episode, ids, tokenizer, ends)
                if blocks is None:
                    episode.ended = ANSWERED if episode.final_answer or (ids and ids[-1] in ends) else BUDGET
                elif turn == max_turns - 1:
                    episode.ended = MAX_TURNS
                else:
                    waiting.append((index, blocks))
            start = time.perf_counter()
            _run_tools(episodes, waiting, workers, views, tool_turns, budget)
            timing["tools_s"] = timing.get("tools_s", 0.0) + time.perf_counter() - start
    finally:
        workers.end()
    for episode in episodes:
        episode.ended = episode.ended or MAX_TURNS
    return episodes


def _run_tools(episodes, waiting, workers: ToolWorkers, views, tool_turns: ToolTurns, budget: int) -> None:
    """Run the calls of every episode that made some (checked against the tools as the episode was shown them, then
    mapped to the real ones), then append each one's tool turns (not trained; named by the real tool)."""
    calls, results = [], {}
    for index, blocks in waiting:
        episode = episodes[index]
        if blocks.problem is not None:
            episode.parse_failures += 1
            results[index] = [("", Outcome(f"error: {blocks.problem}", False))]
            continue
        results[index] = []
        for call in blocks.calls:
            episode.calls += 1
            problem = call_problem(views[index].schemas, call.name, call.arguments)
            name, arguments = views[index].real_call(call.name, call.arguments)
            if problem is not None:
                results[index].append((name, Outcome(problem, False)))
            else:
                results[index].append((name, None))
                calls.append((index, name, arguments))
    outcomes = iter(workers.call(calls)) if calls else iter(())
    for index, _ in waiting:
        episode = episodes[index]
        done = [(name, outcome if outcome is not None else next(outcomes)) for name, outcome in results[index]]
        episode.tool_seconds += sum(outcome.seconds for _, outcome in done)
        messages = [{"role": "tool", "name": name, "content": outcome.text} for name, outcome in done]
        episode.tool_errors += sum(1 for name, outcome in done if name and not outcome.ok)
        episode.messages += [{**m, "ok": o.ok} for m, (_, o) in zip(messages, done, strict=True)]
        glue = tool_turns.ids(messages)
        if len(episode.completion_ids) + len(glue) >= budget:  # no room left to answer: the episode stops here
            episode.ended = BUDGET
            continue
        episode.add(glue, False)
