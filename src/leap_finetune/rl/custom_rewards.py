"""Custom rewards (`./file.py::function`) are the user's code, called by TRL at every step. A wrong answer from
one - an exception, a list of the wrong length, text where a number belongs - was a traceback after the model had
loaded, and NaN a completion silently left out. Here such a function is

- imported with its signature checked (`load_custom_reward`, by the config's check and by the recipe);
- called once before the model loads (`check_custom_rewards`, by `validate` and `run`), on the first training rows
  with placeholder completions (the row's solution and an empty text) and the keyword arguments TRL passes; and
- checked at every call while training (`checked_reward`): the run stops with a LeapError naming the function,
  the training step, the prompt and what it returned (the checkpoints saved before stay intact).

TRL takes one value per completion: a number, or None to leave the completion out of that reward (TRL reads None
as NaN). NaN and infinities are refused: a NaN left out by accident (0/0) would go unnoticed, an infinity makes the
group's advantages NaN.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.data.grpo_rows import category  # (the words a column's kind is said in, here too)
from leap_finetune.errors import LeapError

ROWS_AT_VALIDATE = 2
RAISED_FIX = "correct the function (`leap-finetune --debug ...` shows the traceback)"


def custom_specs(rewards) -> list[tuple[int, str]]:
    """(index in rewards.funcs, spec) of each custom reward."""
    if rewards is None:
        return []
    return [(i, spec) for i, spec in enumerate(rewards.funcs) if isinstance(spec, str) and "::" in spec]


def label(spec: str) -> str:
    """How a custom reward is named in messages: `my_rewards.py::score`."""
    file, _, name = spec.partition("::")
    return f"{Path(file).name}::{name}"


def load_custom_reward(spec: str, where: str) -> Callable:
    """The user's function, imported, with the reward signature: `(completions, **kwargs)`."""
    from leap_finetune.config.user_code import load_user_function

    name = spec.partition("::")[2]
    function = load_user_function(
        spec, kind="custom reward", where=where, signature="def {name}(completions, **kwargs) -> list[float]"
    )
    parameters = inspect.signature(function).parameters
    first = next(iter(parameters.values()), None)
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if first is None or first.name != "completions" or not takes_kwargs:
        found = f"({', '.join(str(p) for p in parameters.values())})"
        raise LeapError(
            f"the custom reward {name}{found} does not have the reward signature",
            where=where,
            fix=f"define def {name}(completions, **kwargs) -> list[float | None]: completions are the "
            "generated texts; kwargs hold the rows' columns (solution, ...) and TRL's extras",
        )
    return function


# ---- what a reward function returned ----------------------------------------------------------------------


def problem(values, count: int) -> tuple[int | None, str] | None:
    """What is wrong with a reward's answer for `count` completions: (the index of the wrong value or None, what
    it is); None when it is one number (or None) per completion."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        return None, f"{category(values)}, not a list"
    if len(values) != count:
        return None, f"{len(values)} value(s) for {count} completion(s)"
    for index, value in enumerate(values):
        number = _number(value)
        if number is _NOT_A_NUMBER:
            return index, f"{_short(value)} ({category(value)})"
        if number is not None and math.isnan(number):
            return index, "NaN"
        if number is not None and math.isinf(number):
            return index, f"{number} (infinite)"
    return None


def numbers(values) -> list[float | None]:
    """The checked values as plain floats (a NumPy or torch scalar included) or None."""
    return [None if value is None else float(value) for value in values]


_NOT_A_NUMBER = object()


def _number(value):
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or getattr(value, "ndim", 0) != 0:
        return _NOT_A_NUMBER
    try:
        return float(value)
    except (TypeError, ValueError):
        return _NOT_A_NUMBER


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fix(found: tuple[int | None, str]) -> str:
    if found[1] == "NaN":
        return "return None for a completion the reward should leave out (NaN is most often 0/0 by accident)"
    return (
        "return a list with one number per completion, in the order of `completions` (None leaves a completion "
        "out of this reward)"
    )


def _raised(err: Exception, spec: str) -> str:
    """`ValueError: bad input (my_rewards.py, line 7)`: the exception and the line of the user's file it came from."""
    file = spec.partition("::")[0]
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if f.filename == file] or frames[-1:]
    at = f" ({Path(own[-1].filename).name}, line {own[-1].lineno})" if own else ""
    return f"{type(err).__name__}: {str(err)[:200]}{at}"


def call(function: Callable, completions: list, kwargs: dict):
    """The function called as TRL calls it (an `async def` one awaited: in a thread of its own when this thread
    already runs an event loop, as a notebook's does)."""
    result = function(completions, **kwargs)
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(result))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _awaited(result)).result()


async def _awaited(result):
    return await result


# ---- before the model loads: once on the first training rows ---------------------------------------------------


@dataclass
class SampleCall:
    """A call as TRL makes it, on placeholder completions of the first training rows."""

    completions: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)  # "prompts.jsonl, line 3" per completion
    kwargs: dict = field(default_factory=dict)


def sample_call(examples: list[dict], columns: list[str], tokenizer, *, episodes: bool = False) -> SampleCall:
    """Each of the first rows with its solution (when it has one) and an empty text as completions (a model may
    stop at once), with the dataset's columns as TRL passes them (prompts, completion_ids, solution, prompt_text,
    the other columns; None where a row lacks one), trainer_state, log_extra and log_metric. `episodes` (an
    `environment:`): the `episode` column too, each completion as an episode of one answer without a tool call."""
    from transformers import TrainerState

    sample = SampleCall()
    extra = [c for c in columns if c not in ("prompt", "solution", "prompt_text", "tools")]
    per_column: dict[str, list] = {
        "prompts": [],
        "completion_ids": [],
        "solution": [],
        "prompt_text": [],
        **({"tools": []} if "tools" in columns else {}),
        **{c: [] for c in extra},
        **({"episode": []} if episodes else {}),
    }
    for example in examples[:ROWS_AT_VALIDATE]:
        solution = example.get("solution") or ""
        for completion in [solution, ""] if solution else [""]:
            sample.completions.append(completion)
            source = example.get("source") or {}
            sample.rows.append(f"{Path(source.get('file', '?')).name}, {source.get('location', '?')}")
            per_column["prompts"].append(example["prompt"])
            per_column["completion_ids"].append(tokenizer(completion, add_special_tokens=False)["input_ids"])
            per_column["solution"].append(solution)
            per_column["prompt_text"].append(example.get("prompt_text", example["prompt"]))
            if "tools" in per_column:
                per_column["tools"].append(example.get("tools", ""))
            if episodes:
                per_column["episode"].append([{"role": "assistant", "content": completion}])
            for column in extra:
                per_column[column].append((example.get("columns") or {}).get(column))
    sample.kwargs = {
        **per_column,
        "trainer_state": TrainerState(),
        "log_extra": lambda *a, **k: None,
        "log_metric": lambda *a, **k: None,
    }
    return sample


def check_custom_rewards(resolved, prepared, tokenizer, console=None) -> None:
    """`validate` and `run`: each custom reward called once on the first training rows (`rewards.check_at_validate:
    false` skips it); what it raises or returns wrong is a LeapError naming the function and the rows."""
    rewards = resolved.rewards
    specs = custom_specs(rewards)
    if not specs or not rewards.check_at_validate or not prepared.train.examples:
        return
    sample = sample_call(
        prepared.train.examples, prepared.train.table.column_names, tokenizer, episodes=resolved.environment is not None
    )
    rows = list(dict.fromkeys(sample.rows))
    on = f"{len(sample.completions)} placeholder completion(s) of {len(rows)} training row(s) ({'; '.join(rows)})"
    skip = "rewards.check_at_validate: false skips this call"
    for index, spec in specs:
        where = f"{resolved.config_path or 'config'}: rewards.funcs[{index}]"
        function = load_custom_reward(spec, where=where)
        try:
            values = call(function, list(sample.completions), dict(sample.kwargs))
        except Exception as err:  # noqa: BLE001 - the user's code: whatever it raised, said with its line
            raise LeapError(
                f"the custom reward {label(spec)} raised {_raised(err, spec)} when called on {on}",
                where=where,
                fix="correct the function (a completion can be empty: the model may stop at "
                f"once; `leap-finetune --debug validate` shows the traceback); {skip}",
            ) from err
        found = problem(values, len(sample.completions))
        if found is not None:
            value, what = found
            detail = (
                what
                if value is None
                else f"its value for the completion {_short(sample.completions[value], 40)} of {sample.rows[value]} is {what}"
            )
            raise LeapError(
                f"the custom reward {label(spec)} returned {_short(values)} when called on {on}: {detail}",
                where=where,
                fix=f"{_fix(found)}; {skip}",
            )
    if console is not None:
        names = ", ".join(label(spec) for _, spec in specs)
        console.print(
            f"custom reward(s) {names}: called once on {on}; the answers are as TRL needs them (this ran "
            f"your code: {skip})",
            markup=False,
            highlight=False,
        )


# ---- while training: every call checked ------------------------------------------------------------------------


def checked_reward(function: Callable, spec: str, where: str, then: Callable[[], str]) -> Callable:
    """The function as TRL calls it, its answer checked: an exception, a wrong length or a value that is not a
    number stops the run with a LeapError (exit 2). `then()` says what to do after the fix (resume from the last
    checkpoint, or run again). An `async def` reward stays async (TRL runs those concurrently)."""

    def failed(what: str, kwargs: dict, completions: list, fix: str, detail: str = "") -> LeapError:
        """`what` the function did, the step, the prompts it scored, then `detail` (the wrong value)."""
        state = kwargs.get("trainer_state")
        step = f" at training step {state.global_step + 1}" if state is not None else ""
        prompts = list(dict.fromkeys(kwargs.get("prompt_text") or kwargs.get("prompts") or []))
        more = f" and {len(prompts) - 1} more" if len(prompts) > 1 else ""
        on = f"{len(completions)} completions of the prompt {_short(prompts[0], 60) if prompts else '?'}{more}"
        return LeapError(
            f"the custom reward {label(spec)} {what}{step}, on {on}{detail}", where=where, fix=f"{fix}, then {then()}"
        )

    def answer(values, kwargs: dict, completions: list) -> list[float | None]:
        found = problem(values, len(completions))
        if found is None:
            return numbers(values)
        index, what = found
        prompts = kwargs.get("prompt_text") or kwargs.get("prompts") or []
        if index is None:
            detail = f": {what}"
        else:
            of = f" of the prompt {_short(prompts[index], 60)}" if index < len(prompts) else ""
            detail = f": value {index + 1}, for the completion {_short(completions[index], 40)}{of}, is {what}"
        raise failed(f"returned {_short(values)}", kwargs, completions, _fix(found), detail)

    if inspect.iscoroutinefunction(function):

        async def reward(completions, **kwargs):
            try:
                values = await function(completions, **kwargs)
            except Exception as err:  # noqa: BLE001 - the user's code
                raise failed(f"raised {_raised(err, spec)}", kwargs, completions, RAISED_FIX) from err
            return answer(values, kwargs, completions)
    else:

        def reward(completions, **kwargs):
            try:
                values = function(completions, **kwargs)
            except Exception as err:  # noqa: BLE001 - the user's code
                raise failed(f"raised {_raised(err, spec)}", kwargs, completions, RAISED_FIX) from err
            return answer(values, kwargs, completions)

    return reward
