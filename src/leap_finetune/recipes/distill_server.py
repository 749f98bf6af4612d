"""A served teacher (`distill.teacher_base_url`, or the server the driver starts on `distill.teacher_gpus`,
launch/teacher_server.py): each step, every document of the batch is sent as token ids to the server's
/v1/completions with `prompt_logprobs: K` (vLLM's request; leap-finetune's own server answers it too,
evaluation/serve_scores.py), and the answer - the teacher's K likeliest next tokens and their log-probs at every
position - becomes the target of the top-k loss (recipes/distill_loss.py `chunked_top_k_loss`).

The documents are found in the batch as the model sees them: padded rows (the attention mask's length), packed or
padding-free rows (a document starts where position_ids is 0). Requests for one batch go out together (a thread
each, up to WORKERS); a server that does not answer within `distill.teacher_timeout_s`, refuses the request or
answers in another shape stops the run with an error naming it.
"""

from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from leap_finetune.errors import LeapError
from leap_finetune.validate.distill import served_teacher_name

WORKERS = 8


class TeacherServer:
    def __init__(self, url: str, top_k: int, timeout_s: float, teacher: str):
        self.url, self.top_k, self.timeout_s, self.teacher = url.rstrip("/"), top_k, timeout_s, teacher
        self.model: str | None = None
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="leap-teacher")
        self.ahead = ThreadPoolExecutor(1, thread_name_prefix="leap-teacher-batch")  # (a batch at a time, ahead)

    def check(self, probe: list[int], written: str | None = None) -> None:
        """Before training: the server answers, serves the teacher (`written`: the config's `teacher:`), and scores a
        prompt with K log-probs."""
        models = self._call("GET", "/models", None)
        served = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
        self.model = served_teacher_name(self.url, served, self.teacher, written or self.teacher)
        self.scores(probe)

    def scores(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [len-1, K], log-probs [len-1, K]): row j is the teacher's distribution of token j+1."""
        body = {"model": self.model, "prompt": tokens, "max_tokens": 1, "temperature": 0.0}
        body["prompt_logprobs"] = self.top_k
        answer = self._call("POST", "/completions", body)
        try:
            entries = answer["choices"][0]["prompt_logprobs"][1:]
            if len(entries) != len(tokens) - 1:
                raise self._error(f"scored {len(entries) + 1} positions of a {len(tokens)}-token prompt")
            ids, logprobs = _top_k_rows(entries, self.top_k)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise self._error(f"answered without prompt_logprobs in vLLM's shape ({str(answer)[:200]})") from None
        # (one tensor per document from Python lists: element-wise writes took ~0.85 s for a 2k-token document)
        return torch.tensor(ids, dtype=torch.long), torch.tensor(logprobs, dtype=torch.float32)

    def submit(self, inputs: dict) -> Future:
        """`targets` of this batch, asked in the background: the student's forward runs while the server answers."""
        held = {k: v.detach().cpu() for k, v in inputs.items() if k in ("input_ids", "attention_mask", "position_ids")}
        device = inputs["input_ids"].device
        return self.ahead.submit(lambda: tuple(t.to(device) for t in self.targets(held)))

    def targets(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's teacher targets in its own layout: (ids, log-probs), each [rows, length, K]; position j holds
        the distribution of token j+1 of its document (-inf where there is none: a document's last token)."""
        input_ids = inputs["input_ids"].cpu()
        rows, length = input_ids.shape
        ids = torch.zeros((rows, length, self.top_k), dtype=torch.long)
        logprobs = torch.full((rows, length, self.top_k), -math.inf)
        spans = documents(input_ids, inputs.get("attention_mask"), inputs.get("position_ids"))
        answers = self.pool.map(lambda span: self.scores(input_ids[span[0], span[1] : span[2]].tolist()), spans)
        for (row, start, end), (doc_ids, doc_logprobs) in zip(spans, answers, strict=True):
            ids[row, start : end - 1], logprobs[row, start : end - 1] = doc_ids, doc_logprobs
        return ids, logprobs

    def _call(self, method: str, path: str, body: dict | None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            fix = None
            if "logprob" in detail.lower() and ("max" in detail.lower() or "greater" in detail.lower()):
                fix = f"start vLLM with --max-logprobs {self.top_k}, or lower distill.teacher_top_k"
            raise self._error(f"refused {path} with HTTP {err.code}: {detail}", fix) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)
            raise self._error(f"did not answer {path} within {self.timeout_s:g} s ({reason})") from None
        except json.JSONDecodeError:
            raise self._error(f"answered {path} with something that is not JSON") from None

    def _error(self, what: str, fix: str | None = None) -> LeapError:
        return LeapError(
            f"the teacher server at {self.url} {what}",
            where="distill.teacher_base_url / teacher_gpus",
            fix=fix
            or "start the server (vllm serve TEACHER --max-logprobs 20, or python -m leap_finetune.evaluation.serve "
            "TEACHER) and check the URL ends in /v1; a slow server: raise distill.teacher_timeout_s",
        )


def _top_k_rows(entries: list, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """vLLM's prompt_logprobs entries -> per position the K likeliest ids and their log-probs, by rank (0 and -inf fill
    a position with fewer)."""
    ids, logprobs = [], []
    for entry in entries:
        ranked = sorted((int(v["rank"]), int(t), float(v["logprob"])) for t, v in entry.items())
        ranked = [r for r in ranked if r[0] <= k][:k]
        missing = k - len(ranked)
        ids.append([r[1] for r in ranked] + [0] * missing)
        logprobs.append([r[2] for r in ranked] + [-math.inf] * missing)
    return ids, logprobs


def documents(input_ids: torch.Tensor, attention_mask, position_ids) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document of at least two tokens: a row up to its attention mask's length, cut where
    position_ids restarts at 0 (packed and padding-free rows)."""
    spans = []
    for row in range(input_ids.shape[0]):
        end = int(attention_mask[row].sum()) if attention_mask is not None else input_ids.shape[1]
        starts = [0]
        if position_ids is not None:
            starts = (position_ids[row, :end].cpu() == 0).nonzero().flatten().tolist() or [0]
            if starts[0] != 0:
                starts.insert(0, 0)
        for start, stop in zip(starts, starts[1:] + [end], strict=True):
            if stop - start >= 2:
                spans.append((row, start, stop))
    return spans
