"""POST /v1/completions with `prompt_logprobs` on leap-finetune's own server (evaluation/serve.py): the teacher of
distillation served on other GPUs or another machine (`distill.teacher_gpus` / `teacher_base_url`,
recipes/distill_server.py) - the request and the answer as vLLM's, so the student reads either server alike.

    {"model": ..., "prompt": [token ids] | [[token ids], ...], "max_tokens": 1, "prompt_logprobs": K}
 -> {"choices": [{"index": i, "text": "", "prompt_logprobs": [null, {"<id>": {"logprob", "rank", "decoded_token"}},
     ...]}]}

Entry j (j >= 1) is the model's distribution of the prompt's token j given the tokens before it: its K most likely
tokens (rank 1..K) and the prompt's own token with its rank. This server scores prompts only: it generates nothing
(`text` is empty), so max_tokens above 1 is refused.
"""

from __future__ import annotations


class BadRequest(ValueError):
    """A request the server cannot take (answered 400 with this text). (Here, below serve.py, which imports it.)"""


MAX_TOKENS_PER_REQUEST = 65_536  # (one request's prompts together; a longer one is refused, not an out-of-memory)


def read_scoring(body: dict) -> tuple[list[list[int]], int]:
    """(the prompts as token ids, K), or BadRequest saying what was expected."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt):
        prompts = prompt
    else:
        raise BadRequest("prompt: token ids (a list of integers, or a list of such lists) are expected")
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for p in prompts for t in p):
        raise BadRequest("prompt: every token id must be a non-negative integer")
    if sum(map(len, prompts)) > MAX_TOKENS_PER_REQUEST:
        raise BadRequest(f"prompt: more than {MAX_TOKENS_PER_REQUEST:,} tokens in one request: send fewer at once")
    k = body.get("prompt_logprobs")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise BadRequest("prompt_logprobs: a non-negative integer (how many of the likeliest tokens per position)")
    if int(body.get("max_tokens") or 1) > 1:
        raise BadRequest("this server scores prompts (prompt_logprobs) and generates nothing: send max_tokens 1")
    return prompts, k


def prompt_logprobs(model, tokenizer, prompts: list[list[int]], k: int) -> list[list[dict | None]]:
    """vLLM's `prompt_logprobs` of each prompt (one padded forward for all of them; right padding leaves the
    earlier positions as they are in a causal model)."""
    import torch

    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    if any(t >= vocab for p in prompts for t in p):
        raise BadRequest(f"prompt: a token id is beyond the model's {vocab:,} output tokens")
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
        mask[row, : len(prompt)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    answers = []
    for row, prompt in enumerate(prompts):
        logprobs = logits[row, : len(prompt) - 1].float().log_softmax(-1)
        actual = torch.tensor(prompt[1:], device=logprobs.device)
        own = logprobs.gather(-1, actual[:, None])[:, 0]
        ranks = ((logprobs > own[:, None]).sum(-1) + 1).tolist()
        top = logprobs.topk(min(k, vocab), dim=-1) if k else None
        values = top.values.tolist() if top is not None else [[] for _ in prompt[1:]]
        indices = top.indices.tolist() if top is not None else [[] for _ in prompt[1:]]
        # (the tokens' text, as vLLM's decoded_token: one vocabulary lookup for all of them, not a decode each)
        text = iter(tokenizer.convert_ids_to_tokens([t for position in indices for t in position] + prompt[1:]))
        named = [[next(text) for _ in position] for position in indices]
        entries: list[dict | None] = [None]
        for position, (token, word) in enumerate(zip(prompt[1:], text, strict=True)):
            entry = {
                str(index): {"logprob": value, "rank": rank + 1, "decoded_token": name}
                for rank, (value, index, name) in enumerate(zip(values[position], indices[position], named[position]))
            }
            entry.setdefault(
                str(token), {"logprob": float(own[position]), "rank": ranks[position], "decoded_token": word}
            )
            entries.append(entry)
        answers.append(entries)
    return answers


def add_completions_endpoint(app, generator, loaded: dict) -> None:
    """POST /v1/completions (prompt scoring only) on `app`, run between generation batches (the generator's lock)."""
    import asyncio
    import time

    from fastapi import HTTPException

    def score(prompts, k):
        with generator.lock:
            return prompt_logprobs(generator.model, generator.tokenizer, prompts, k)

    @app.post("/v1/completions")
    async def completions(body: dict):
        try:
            prompts, k = read_scoring(body)
            scored = await asyncio.to_thread(score, prompts, k)
        except BadRequest as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        except Exception as err:  # noqa: BLE001 - the caller gets the error as a 500
            raise HTTPException(status_code=500, detail=f"{type(err).__name__}: {err}") from None
        return {
            "id": f"leap-{time.time_ns()}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": loaded["model"],
            "choices": [
                {"index": i, "text": "", "finish_reason": "length", "logprobs": None, "prompt_logprobs": entries}
                for i, entries in enumerate(scored)
            ],
        }
