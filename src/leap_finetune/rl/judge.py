"""An LLM judge as a GRPO reward, over the OpenAI-compatible chat-completions API (vLLM, transformers
serve, llama.cpp's server, hosted APIs), through the `openai` client (its retries with backoff cover
connection errors, 429 and 5xx answers).

Each completion is one request, `max_concurrency` in flight. The score is read from a JSON object
(`{"score": 7}`) or else the first number of the answer, and normalised from [min_score, max_score]
to [0, 1]. A request that times out, fails after its retries, or answers without a number gets
`failure_score` and is counted: `judge/failures` in the step's metrics. A judge never stops training.
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from leap_finetune.config.schema import JudgeConfig

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OBJECT = re.compile(r"\{[^{}]*\}")


def parse_score(text: str) -> float | None:
    """`{"score": S}` anywhere in the answer, else its first number; None when there is neither."""
    for candidate in _OBJECT.findall(text or ""):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("score"), (int, float)) and not isinstance(value["score"], bool):
            return float(value["score"])
    match = _NUMBER.search(text or "")
    return float(match.group()) if match else None


def fill_template(template: str, **values) -> str:
    return template.format(**values)


class Judge:
    """The reward function (TRL calls it with the completions and the rows' columns)."""

    __name__ = "judge"

    def __init__(self, config: JudgeConfig, base_url: str):
        self.config = config
        self.base_url = base_url.rstrip("/")
        self.failures_total = 0
        self.requests_total = 0
        self._client = None
        self._lock = threading.Lock()

    def client(self):
        if self._client is None:
            from openai import OpenAI

            key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
            self._client = OpenAI(base_url=self.base_url, api_key=key or "not-needed",
                                  timeout=self.config.timeout_s, max_retries=self.config.retries)
        return self._client

    def score_one(self, prompt: str, completion: str, solution: str) -> float | None:
        """The normalised score of one completion, or None (a failure)."""
        c = self.config
        message = fill_template(c.prompt_template, prompt=prompt, completion=completion, solution=solution or "",
                                min_score=_plain(c.min_score), max_score=_plain(c.max_score))
        try:
            answer = self.client().chat.completions.create(
                model=c.model, messages=[{"role": "user", "content": message}], temperature=c.temperature,
                max_tokens=c.max_tokens)
            text = answer.choices[0].message.content or ""
        except Exception:  # noqa: BLE001 - any failure of the judge is counted, never raised into training
            return None
        score = parse_score(text)
        if score is None:
            return None
        return min(1.0, max(0.0, (score - c.min_score) / (c.max_score - c.min_score)))

    def __call__(self, completions, prompts=None, solution=None, prompt_text=None, log_metric=None, **_) -> list[float]:
        from leap_finetune.rl.rewards import _text

        questions = prompt_text if prompt_text is not None else prompts
        solutions = solution if solution is not None else [""] * len(completions)
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            scores = list(pool.map(lambda item: self.score_one(*item),
                                   zip(questions, (_text(c) for c in completions), solutions)))
        failures = sum(score is None for score in scores)
        with self._lock:
            self.failures_total += failures
            self.requests_total += len(scores)
        if log_metric is not None:
            log_metric("judge/failures", float(failures))
        return [self.config.failure_score if score is None else score for score in scores]


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)
