"""GRPO's reward functions: the built-ins, custom `file.py::function` rewards, and how the config's
`rewards:` block becomes the list TRL's GRPOTrainer calls.

Every reward function has TRL's signature: `fn(completions, **columns) -> list[float | None]`, where
`completions` are the generated texts (strings: prompts are rendered by leap-finetune, so TRL sees text,
not messages), and the columns are the dataset's (`solution`, any other column of the rows), plus
TRL's `prompts`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric`. None skips a completion
for that reward (TRL averages the others).

`tool_call_is_valid(completion, tools=None) -> bool` is also importable from here for custom rewards. TRL's
`completions` come without special tokens, and LFM's tool-call markers are special tokens: a custom reward that
names a `completions_with_markers` parameter gets the completions with them (what tool_call_is_valid needs).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import re
from collections.abc import Callable

from leap_finetune.data.solutions import final_answer, normalise
from leap_finetune.data.tool_calls import tool_call_is_valid
from leap_finetune.errors import LeapError
from leap_finetune.rl.custom_rewards import checked_reward, label, load_custom_reward

__all__ = ["tool_call_is_valid", "BUILTIN_REWARDS", "build_reward", "check_reward_spec", "reward_name"]


def _text(completion) -> str:
    """A completion as text (TRL passes strings for text prompts, one-message lists for chat prompts)."""
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return completion or ""


def _math_equal(solution: str, answer: str) -> bool | None:
    """math-verify's verdict when it is installed and can parse the solution; None otherwise."""
    if importlib.util.find_spec("math_verify") is None:
        return None
    import logging
    import threading

    from math_verify import parse, verify

    # math-verify's timeouts use signal.alarm, which works in the main thread only (as in TRL's accuracy_reward)
    main = threading.current_thread() is threading.main_thread()
    if not main:
        logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse(solution, parsing_timeout=5 if main else None)
    if not gold:
        return None
    return bool(verify(gold, parse(answer, parsing_timeout=5 if main else None), timeout_seconds=5 if main else None))


def accuracy(completions, solution, **_) -> list[float | None]:
    """1 when the completion's answer matches `solution`: math-aware with math-verify installed (so
    `\\frac{1}{2}` equals `0.5`), else the normalised final answer (a \\boxed{} value or the text, lower
    case, punctuation ignored) equals the solution or starts with it as a whole word. No solution: None."""
    rewards = []
    for completion, gold in zip(completions, solution, strict=True):
        if gold is None or str(gold).strip() == "":
            rewards.append(None)
            continue
        answer = final_answer(_text(completion))
        verdict = _math_equal(str(gold), answer)
        if verdict is None:
            want, got = normalise(final_answer(str(gold))), normalise(answer)
            verdict = bool(want) and (got == want or got.startswith(want + " "))  # (no credit against nothing)
        rewards.append(1.0 if verdict else 0.0)
    return rewards


def format_reward(pattern: str) -> Callable:
    compiled = re.compile(pattern, re.DOTALL)

    def format(completions, **_) -> list[float]:  # noqa: A001 - the reward's logged name
        return [1.0 if compiled.search(_text(c)) else 0.0 for c in completions]

    return format


def length_reward(target_tokens: int) -> Callable:
    def length(completions, completion_ids=None, **_) -> list[float]:
        counts = (
            [len(ids) for ids in completion_ids]
            if completion_ids is not None
            else [len(_text(c).split()) for c in completions]
        )
        return [max(0.0, 1.0 - abs(n - target_tokens) / target_tokens) for n in counts]

    return length


def _with_markers(completions, completion_ids, tokenizer) -> list[str]:
    """The completions as text with their tool-call markers. TRL decodes completions without special tokens, and
    LFM's <|tool_call_start|> / <|tool_call_end|> are special tokens: without them no call would parse. So the tool
    rewards decode TRL's `completion_ids` again, keeping every special token but end-of-turn and padding."""
    if tokenizer is None or completion_ids is None:
        return [_text(c) for c in completions]
    drop = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    return [
        tokenizer.decode([int(i) for i in ids if int(i) not in drop], skip_special_tokens=False)
        for ids in completion_ids
    ]


def tool_call_valid(completions, tools=None, completion_ids=None, tokenizer=None, **_) -> list[float]:
    """1 when the completion holds LFM tool calls that parse and (with the row's `tools`) name declared tools.
    `tools` is one entry per completion: the row's tools as JSON text as the prepared data holds them ("" for a
    row without), or a list."""
    per_row = [_row_tools(t) for t in tools] if isinstance(tools, list) else [None] * len(completions)
    texts = _with_markers(completions, completion_ids, tokenizer)
    return [1.0 if tool_call_is_valid(text, t) else 0.0 for text, t in zip(texts, per_row, strict=True)]


def tool_call_match(completions, solution, completion_ids=None, tokenizer=None, **_) -> list[float | None]:
    """The completion's tool calls against the reference turn's (`solution`: the row's last assistant turn, its calls
    in LFM notation), scored as the `tool_call` benchmark metric does (data/tool_call_score.py), with partial
    credit: 0.5 x exact + 0.25 x names + 0.25 x argument F1; a turn that should not call: 1 when it makes no call;
    calls that do not parse: 0. A row without a solution: None (not scored)."""
    from leap_finetune.data.tool_call_score import score_turn

    rewards: list[float | None] = []
    for completion, gold in zip(_with_markers(completions, completion_ids, tokenizer), solution, strict=True):
        if gold is None or str(gold).strip() == "":
            rewards.append(None)
            continue
        reference = _reference_calls(str(gold))
        if reference is None:  # (a solution whose calls do not parse: the rows' check refuses it; never scored)
            rewards.append(None)
            continue
        found = score_turn(completion, reference)
        if not reference:
            rewards.append(found.no_call)
        else:
            rewards.append(
                0.0 if not found.parsed else 0.5 * found.exact + 0.25 * found.name + 0.25 * found.argument_f1
            )
    return rewards


@functools.lru_cache(maxsize=1024)
def _reference_calls(solution: str):
    from leap_finetune.data.tool_call_score import reference_calls

    return reference_calls(solution)[0]


def _row_tools(tools) -> list | None:
    if isinstance(tools, str):
        return _parsed_tools(tools)
    return tools or None


@functools.lru_cache(maxsize=1024)
def _parsed_tools(text: str) -> list | None:
    # (a row's completions share its tools text: parsed once, not once per completion and step)
    return json.loads(text) if text else None


def tool_success(completions, episode=None, **_) -> list[float | None]:
    """environment: the share of the episode's tool calls that parsed and ran without error (a call that does not
    parse, names no declared tool, has bad arguments, raises or times out fails). An episode without a call: None."""
    if episode is None:
        return [None] * len(completions)
    rewards: list[float | None] = []
    for messages in episode:
        results = [m for m in messages if m.get("role") == "tool"]
        rewards.append(sum(1.0 for m in results if m.get("ok")) / len(results) if results else None)
    return rewards


def turn_penalty_reward(per_turn: float) -> Callable:
    def turn_penalty(completions, episode=None, **_) -> list[float]:
        """environment: -per_turn for every assistant turn after the first (fewer round trips score higher)."""
        if episode is None:
            return [0.0] * len(completions)
        return [
            -per_turn * max(0, sum(1 for m in messages if m.get("role") == "assistant") - 1) for messages in episode
        ]

    return turn_penalty


def box_reward(kind: str) -> Callable:
    """Grounding (rl/grounding.py): the completion's boxes against the solution's, matched one to one."""
    from leap_finetune.rl.grounding import answer_score

    def reward(completions, solution, **_) -> list[float | None]:
        from leap_finetune.data.render import split_thinking

        # (the boxes of the answer, not of a <think> block before it: as the benchmarks score it)
        return [answer_score(split_thinking(_text(c))[0], s, kind) for c, s in zip(completions, solution, strict=True)]

    reward.__name__ = kind
    return reward


def box_format(completions, **_) -> list[float]:
    """1 when the completion holds a box with area ([x1, y1, x2, y2], x2 > x1 and y2 > y1), every box it holds
    is one, and it is short of nothing else; 0 otherwise."""
    from leap_finetune.rl.grounding import boxes_in

    scores = []
    for completion in completions:
        boxes = boxes_in(_text(completion))
        scores.append(float(bool(boxes) and all(b[2] > b[0] and b[3] > b[1] for b in boxes)))
    return scores


# name -> (factory taking the options, the options it needs, what it does)
BUILTIN_REWARDS: dict[str, tuple[Callable, tuple[str, ...], str]] = {
    "accuracy": (lambda: accuracy, (), "the answer matches `solution` (math-aware with math-verify)"),
    "format": (format_reward, ("pattern",), "the completion matches a regular expression"),
    "length": (length_reward, ("target_tokens",), "1 at target_tokens completion tokens, falling linearly to 0"),
    "tool_call_valid": (lambda: tool_call_valid, (), "LFM tool calls that parse, naming declared tools"),
    "tool_call_match": (
        lambda: tool_call_match,
        (),
        "the completion's tool calls against the solution's: 0.5 exact + 0.25 names + 0.25 argument F1",
    ),
    "tool_success": (lambda: tool_success, (), "environment: the share of the episode's tool calls that ran"),
    "turn_penalty": (turn_penalty_reward, ("per_turn",), "environment: -per_turn for each turn after the first"),
    "iou": (lambda: box_reward("iou"), (), "grounding: the boxes' IoU with the solution's (matched one to one)"),
    "giou": (lambda: box_reward("giou"), (), "grounding: generalized IoU, -1 to 1 (boxes that miss still compare)"),
    "ciou": (lambda: box_reward("ciou"), (), "grounding: complete IoU (centre distance and aspect ratio too)"),
    "box_format": (lambda: box_format, (), "grounding: the completion holds boxes [x1, y1, x2, y2] with area"),
}
# built-in rewards that score an episode (they need `environment:`)
EPISODE_REWARDS = ("tool_success", "turn_penalty")


def reward_name(spec: str | dict) -> str:
    """How a reward is named in the metrics (rewards/NAME/mean)."""
    # (read before the entry itself is checked, so a mapping without `name` is named here as "": the check that
    # follows says what is missing - it was a KeyError traceback)
    name = str(spec.get("name", "")) if isinstance(spec, dict) else str(spec)
    return name.rsplit("::", 1)[-1] if "::" in name else name


def check_reward_spec(spec, index: int, where: str) -> str | dict:
    """A `rewards.funcs` entry checked (a custom file imported, its function's signature read); returns it
    with options validated. Custom paths must already be absolute."""
    key = f"rewards.funcs[{index}]"
    name, options = _name_and_options(spec, key, where)
    if "::" in name:
        if options:
            raise LeapError(
                f"{key}: a custom reward takes no options ({', '.join(options)})",
                where=where,
                fix="read them from the rows' columns instead, or set them in your file",
            )
        load_custom_reward(name, where=f"{where}: {key}")
        return name
    _check_builtin(name, key, where)
    _check_options(name, options, key, where)
    return {"name": name, **options} if options else name


def _name_and_options(spec, key: str, where: str) -> tuple[str, dict]:
    """`accuracy`, `./file.py::function` or `{name: format, pattern: ...}`: (the name, its options)."""
    if isinstance(spec, dict):
        if "name" not in spec or not isinstance(spec["name"], str):
            raise LeapError(
                f"{key} is a mapping without a `name`",
                where=where,
                fix="write e.g. {name: format, pattern: '^Answer:'}",
            )
        return spec["name"], {k: v for k, v in spec.items() if k != "name"}
    if isinstance(spec, str):
        return spec, {}
    raise LeapError(
        f"{key} is {spec!r}",
        where=where,
        fix="give a built-in name (" + ", ".join(BUILTIN_REWARDS) + ") or ./file.py::function",
    )


def _check_builtin(name: str, key: str, where: str) -> None:
    """A built-in reward's name, or the custom one it was meant to be (`file.py:function`, one colon)."""
    if name not in BUILTIN_REWARDS and (":" in name or name.endswith(".py")):
        file, _, function = name.rpartition(":") if ":" in name else (name, "", "my_reward")
        file = file if file.endswith(".py") else file.replace(".", "/") + ".py"
        raise LeapError(
            f"{key} is '{name}': a custom reward is named by its file and function, with two colons",
            where=where,
            fix=f"write {file if file.startswith(('.', '/')) else './' + file}::{function} "
            "(the path relative to the config file's folder)",
        )
    if name not in BUILTIN_REWARDS:
        from leap_finetune.config.suggest import unknown_key_fix

        raise LeapError(
            f"{key} is '{name}', not a built-in reward",
            where=where,
            fix=_reward_fix(name, unknown_key_fix),
        )


def _reward_fix(name: str, unknown_key_fix) -> str:
    """The close built-in names, else every one (an answer's correctness is `accuracy`)."""
    said = unknown_key_fix(name, BUILTIN_REWARDS)
    if "did you mean" not in said:
        said = f"the built-in rewards: {', '.join(BUILTIN_REWARDS)} (an answer's correctness: accuracy)"
    return said + "; or a custom one: ./rewards.py::my_reward"


def _check_options(name: str, options: dict, key: str, where: str) -> None:
    """A built-in reward's options: the ones it takes, each present and of its kind."""
    _, needed, _ = BUILTIN_REWARDS[name]
    unknown = sorted(set(options) - set(needed))
    if unknown:
        raise LeapError(
            f"{key}: the '{name}' reward has no option {', '.join(unknown)}",
            where=where,
            fix=f"its options: {', '.join(needed) or 'none'}",
        )
    missing = [n for n in needed if n not in options]
    if missing:
        example = {"pattern": "'^Answer: '", "target_tokens": "200", "per_turn": "0.1"}[missing[0]]
        raise LeapError(
            f"{key}: the '{name}' reward needs {', '.join(missing)}",
            where=where,
            fix=f"write {{name: {name}, {missing[0]}: {example}}}",
        )
    if name == "format":
        try:
            re.compile(options["pattern"])
        except (re.error, TypeError) as err:
            raise LeapError(
                f"{key}: pattern {options['pattern']!r} is not a regular expression ({err})",
                where=where,
                fix="correct the pattern (Python `re` syntax)",
            ) from None
    per_turn = options.get("per_turn")
    if name == "turn_penalty" and (
        not isinstance(per_turn, (int, float)) or isinstance(per_turn, bool) or not 0 <= per_turn < float("inf")
    ):
        raise LeapError(f"{key}: per_turn is {per_turn!r}", where=where, fix="give a number >= 0, e.g. 0.1")
    target = options.get("target_tokens")
    if name == "length" and (not isinstance(target, int) or isinstance(target, bool) or target <= 0):
        raise LeapError(f"{key}: target_tokens is {target!r}", where=where, fix="give a whole number of tokens > 0")


# built-in rewards that read tool-call markers: given the run's tokenizer (see _with_markers)
READS_MARKERS = ("tool_call_valid", "tool_call_match")
# a custom reward's parameter that receives the completions with their tool-call markers (TRL's have none)
MARKED = "completions_with_markers"


def _given_markers(custom: Callable, tokenizer) -> Callable:
    """The custom reward called with `completions_with_markers` too (it names that parameter)."""
    if inspect.iscoroutinefunction(custom):

        async def marked_async(completions, completion_ids=None, **kwargs):
            texts = _with_markers(completions, completion_ids, tokenizer)
            return await custom(completions, completion_ids=completion_ids, **{MARKED: texts}, **kwargs)

        return functools.wraps(custom)(marked_async)

    def marked(completions, completion_ids=None, **kwargs):
        texts = _with_markers(completions, completion_ids, tokenizer)
        return custom(completions, completion_ids=completion_ids, **{MARKED: texts}, **kwargs)

    return functools.wraps(custom)(marked)


def build_reward(
    spec: str | dict, where: str | None = None, then: Callable[[], str] | None = None, tokenizer=None
) -> Callable:
    """The callable for a checked `rewards.funcs` entry, named as it is logged. A custom one is wrapped so that
    what it raises or returns wrong stops the run with a LeapError at `where` (custom_rewards.checked_reward;
    `then()`: what to do after the fix). `tokenizer`: the run's, for the rewards that read tool-call markers."""
    name = spec["name"] if isinstance(spec, dict) else spec
    if "::" in name:
        custom = load_custom_reward(name, where=where or name)
        if tokenizer is not None and MARKED in inspect.signature(custom).parameters:
            custom = _given_markers(custom, tokenizer)
        function = checked_reward(custom, name, where or label(name), then or (lambda: "run again"))
    else:
        factory, needed, _ = BUILTIN_REWARDS[name]
        function = factory(**{k: spec[k] for k in needed}) if needed else factory()
        if name in READS_MARKERS and tokenizer is not None:
            function = functools.partial(function, tokenizer=tokenizer)
    function.__name__ = reward_name(spec)
    return function
