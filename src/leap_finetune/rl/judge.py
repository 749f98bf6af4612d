"""An LLM judge as a GRPO reward, over the OpenAI-compatible chat-completions API (vLLM, transformers
serve, llama.cpp's server, hosted APIs), through the `openai` client (its retries with backoff cover
connection errors, timeouts, 429 and 5xx answers).

Each completion is one request, `max_concurrency` in flight. The score is read from a JSON object
(`{"score": 7}`) or else the first number of the answer, and normalised from [min_score, max_score]
to [0, 1]. A request that times out, fails after its retries, or answers without a number gets
`failure_score` and is counted: `judge/failures` and `judge/requests` in the step's metrics, the progress
line, the run report (with the last reason).

A judge that is down must not cost hours in silence (measured before: a hanging judge cost ~180 s per step,
exit 0, "reward 0.00 -> 0.00"): when the first `max_concurrency` requests of a step all fail, the step's other
completions are not sent (the judge is down; each scores failure_score), and after `max_failed_steps` steps in a
row in which every request failed, the run saves a checkpoint and stops with an error naming the judge and its
last failure (JudgeWatch). `validate` asks the server for its models first (`check_judge_server`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from leap_finetune.config.schema_grpo import JudgeConfig
from leap_finetune.errors import LeapError

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OBJECT = re.compile(r"\{[^{}]*\}")


def parse_score(text: str) -> float | None:
    """`{"score": S}` anywhere in the answer, else its first number; None when there is neither."""
    for candidate in _OBJECT.findall(text or ""):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(value, dict)
            and isinstance(value.get("score"), (int, float))
            and not isinstance(value["score"], bool)
        ):
            return float(value["score"])
    match = _NUMBER.search(text or "")
    return float(match.group()) if match else None


def fill_template(template: str, **values) -> str:
    return template.format(**values)


def describe_failure(err: Exception) -> str:
    """One line for a failed request: the HTTP status and the server's words, or the connection error."""
    status = getattr(err, "status_code", None)
    message = str(getattr(err, "message", None) or err).strip().splitlines()[0] if str(err).strip() else ""
    kind = type(err).__name__
    if status is not None:
        return f"HTTP {status} ({kind}): {message[:200]}"
    return f"{kind}: {message[:200]}" if message else kind


def _client(config: JudgeConfig, base_url: str, timeout: float | None = None, retries: int | None = None):
    from openai import OpenAI

    key = os.environ.get(config.api_key_env) if config.api_key_env else None
    return OpenAI(
        base_url=base_url,
        api_key=key or "not-needed",
        timeout=config.timeout_s if timeout is None else timeout,
        max_retries=config.retries if retries is None else retries,
    )


class Judge:
    """The reward function (TRL calls it with the completions and the rows' columns)."""

    __name__ = "judge"

    def __init__(self, config: JudgeConfig, base_url: str):
        self.config = config
        self.base_url = base_url.rstrip("/")
        self.failures_total = 0
        self.requests_total = 0
        self.failed_steps_in_a_row = 0
        self._step_failed: tuple[int | None, bool] | None = None  # (training step, every request of it failed)
        self.last_failure: str | None = None
        self.stop_reason: str | None = None  # set when max_failed_steps is reached (JudgeWatch stops the run)
        self._client = None
        self._lock = threading.Lock()

    def client(self):
        if self._client is None:
            self._client = _client(self.config, self.base_url)
        return self._client

    def _score(self, prompt: str, completion: str, solution: str) -> tuple[float | None, bool]:
        """(score or None, whether a failure was the server's: no answer, a timeout, an HTTP error)."""
        c = self.config
        message = fill_template(
            c.prompt_template,
            prompt=prompt,
            completion=completion,
            solution=solution or "",
            min_score=_plain(c.min_score),
            max_score=_plain(c.max_score),
        )
        try:
            answer = self.client().chat.completions.create(
                model=c.model,
                messages=[{"role": "user", "content": message}],
                temperature=c.temperature,
                max_tokens=c.max_tokens,
            )
            text = answer.choices[0].message.content or ""
        except Exception as err:  # noqa: BLE001 - any failure of the judge is counted, never raised into training
            self.last_failure = describe_failure(err)
            return None, True
        score = parse_score(text)
        if score is None:
            self.last_failure = f"an answer without a score: {text.strip()[:120]!r}"
            return None, False
        return min(1.0, max(0.0, (score - c.min_score) / (c.max_score - c.min_score))), False

    def score_all(self, items: list[tuple]) -> list[float | None]:
        """Every completion scored, `max_concurrency` at a time; when the whole first round failed on the server's
        side (no answer, timeouts, HTTP errors), the rest are not sent: the judge is down, and a step costs one
        round of timeouts, not one per completion. (Answers without a score come from a judge that is up: the
        other completions are still sent.)"""
        first = self.config.max_concurrency
        pool = ThreadPoolExecutor(max_workers=self.config.max_concurrency)
        try:
            head = list(pool.map(lambda item: self._score(*item), items[:first]))
            if head and all(score is None and server for score, server in head) and len(items) > first:
                return [None] * len(items)
            return [score for score, _ in head] + [
                score for score, _ in pool.map(lambda item: self._score(*item), items[first:])
            ]
        finally:
            # not `with`: interrupted (a second Ctrl-C), the run must not wait for requests in flight to time out
            pool.shutdown(wait=False, cancel_futures=True)

    def __call__(
        self, completions, prompts=None, solution=None, prompt_text=None, log_metric=None, trainer_state=None, **_
    ) -> list[float]:
        from leap_finetune.rl.rewards import _text

        questions = prompt_text if prompt_text is not None else prompts
        solutions = solution if solution is not None else [""] * len(completions)
        scores = self.score_all(list(zip(questions, (_text(c) for c in completions), solutions)))
        failures = sum(score is None for score in scores)
        with self._lock:
            self.failures_total += failures
            self.requests_total += len(scores)
            self._count_step(getattr(trainer_state, "global_step", None), bool(scores) and failures == len(scores))
            limit = self.config.max_failed_steps
            if limit and self.failed_steps_in_a_row >= limit and self.stop_reason is None:
                self.stop_reason = (
                    f"the judge at {self.base_url} failed every request for {self.failed_steps_in_a_row} "
                    f"steps in a row (last: {self.last_failure})"
                )
        if log_metric is not None:
            log_metric("judge/failures", float(failures))
            log_metric("judge/requests", float(len(scores)))
        return [self.config.failure_score if score is None else score for score in scores]

    def _count_step(self, step: int | None, all_failed: bool) -> None:
        """Steps in a row in which every request failed: counted per training step (TRL may call the reward several
        times in one step: accumulation, generation batches), an evaluation's calls within the step included."""
        if step is None:  # (called outside a trainer: each call is a step)
            self.failed_steps_in_a_row = self.failed_steps_in_a_row + 1 if all_failed else 0
            return
        previous = self._step_failed
        if previous is not None and previous[0] == step:
            if not all_failed and previous[1]:  # a request of this step succeeded after all: no streak
                self.failed_steps_in_a_row = 0
                self._step_failed = (step, False)
            return
        self._step_failed = (step, all_failed)
        self.failed_steps_in_a_row = self.failed_steps_in_a_row + 1 if all_failed else 0


def judges(trainer) -> list[Judge]:
    return [f for f in getattr(trainer, "reward_funcs", []) or [] if isinstance(f, Judge)]


def judge_watch(stop_on_signal):
    """A callback that says judge failures on the console as they happen (rank 0), and makes a judge that
    reached max_failed_steps stop the run like a signal does (every rank saves the same step: StopOnSignal's
    reasons, agreed in its one all-reduce per step)."""
    from transformers import TrainerCallback

    class JudgeWatch(TrainerCallback):
        def __init__(self):
            self.judges: list[Judge] = []
            self._said: tuple | None = None
            stop_on_signal.reasons.append(lambda: any(j.stop_reason for j in self.judges))

        @property
        def stopped(self) -> bool:
            return stop_on_signal.stopped_by_reason

        def on_log(self, args, state, control, logs=None, **kwargs):
            """The first failure, when the reason changes, and every 20 steps while they last."""
            failed = (logs or {}).get("judge/failures")
            if not state.is_world_process_zero or not self.judges or not failed:
                return
            reason = self.judges[0].last_failure
            if self._said is None or self._said[0] != reason or state.global_step - self._said[1] >= 20:
                requests = (logs or {}).get("judge/requests")
                share = f"{float(failed):g} of {float(requests):g}" if requests else f"{float(failed):g}"
                print(
                    f"  step {state.global_step}: the judge failed {share} requests (last: {reason})",
                    file=sys.stderr,
                    flush=True,
                )
                self._said = (reason, state.global_step)

    return JudgeWatch()


def judge_totals(trainer) -> dict | None:
    """Requests and failures over every rank (a collective in a distributed run: every rank calls it), and the
    last failure this rank saw; None without a judge."""
    found = judges(trainer)
    if not found:
        return None
    judge = found[0]
    counts = [judge.failures_total, judge.requests_total]
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        import torch

        value = torch.tensor(counts, dtype=torch.int64, device=trainer.args.device)
        dist.all_reduce(value)
        counts = value.tolist()
    return {
        "failures": int(counts[0]),
        "requests": int(counts[1]),
        "last_failure": judge.last_failure,
        "stop_reason": judge.stop_reason,
    }


def check_judge_server(resolved, console=None) -> None:
    """`validate` and `run`: an external judge (`base_url`) answers GET /models within its timeout and serves
    `model`. A local judge is started and checked by the driver."""
    rewards = resolved.rewards
    judge = rewards.judge if rewards is not None else None
    if judge is None or judge.base_url is None or not judge.check_at_validate:
        return
    where = f"{resolved.config_path or 'config'}: rewards.judge.base_url"
    try:
        listed = _client(judge, judge.base_url.rstrip("/"), timeout=min(judge.timeout_s, 15), retries=0).models.list()
        served = [m.id for m in listed.data]
    except Exception as err:  # noqa: BLE001 - whatever the server or the network did, said in one line
        raise LeapError(
            f"the judge at {judge.base_url} does not answer GET /models ({describe_failure(err)})",
            where=where,
            fix="start the judge server (or correct base_url: an OpenAI-compatible API, "
            "usually ending in /v1); rewards.judge.check_at_validate: false skips this check",
        ) from None
    if served and judge.model not in served and console is not None:
        # a warning, not an error: some servers answer whatever name is asked (llama.cpp's) or list aliases
        console.print(
            f"[yellow]warning: the judge at {judge.base_url} lists {', '.join(served[:8])}, not "
            f"'{judge.model}' (rewards.judge.model): a server that needs the name will refuse every "
            "request[/yellow]",
            markup=True,
        )


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)
