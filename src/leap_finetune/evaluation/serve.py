"""The evaluation server of `async_eval.mode: reserved` where vLLM is not installed: an OpenAI-compatible
chat completions endpoint that answers with the same batched generation as sync mode
(evaluation/generation.py), on one model folder.

    python -m leap_finetune.evaluation.serve MODEL_DIR --port 8100 [--device cuda] [--batch-size 32]

Why our own: `transformers serve` answers one request at a time for LFM2 (its continuous batching has no
cache for LFM2's convolution layers: "Invalid layer type: conv"), so a 200-row benchmark took 148 s on an
H200 where sync mode's batched generation takes ~11 s. Here requests that arrive together are generated
together (up to --batch-size), with the tokenizer's chat template (the snapshot's is the one the benchmarks
render with). Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions (non-streaming).
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from concurrent.futures import Future


class BatchedGenerator:
    """Requests queue up; one thread takes what has arrived (up to batch_size, waiting `gather_s` for more)
    and generates it as one batch per (max_tokens, sampling) setting."""

    def __init__(self, model, tokenizer, batch_size: int, gather_s: float = 0.02):
        self.model, self.tokenizer, self.batch_size, self.gather_s = model, tokenizer, batch_size, gather_s
        self.requests: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="leap-serve").start()

    def submit(self, messages: list[dict], options: dict) -> Future:
        future: Future = Future()
        self.requests.put((messages, options, future))
        return future

    def _loop(self) -> None:
        while True:
            batch = [self.requests.get()]
            deadline = time.monotonic() + self.gather_s
            while len(batch) < self.batch_size:
                try:
                    batch.append(self.requests.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            groups: dict[tuple, list] = {}
            for item in batch:
                groups.setdefault(tuple(sorted(item[1].items())), []).append(item)
            for key, items in groups.items():
                self._generate(dict(key), items)

    def _generate(self, options: dict, items: list) -> None:
        from leap_finetune.evaluation.generation import generate

        try:
            prompts = [
                self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                for messages, _, _ in items
            ]
            answers = generate(
                self.model,
                self.tokenizer,
                prompts,
                max_new_tokens=options["max_tokens"],
                batch_size=self.batch_size,
                do_sample=options["temperature"] > 0,
                temperature=options["temperature"] or 1.0,
                top_p=options["top_p"],
            )
        except Exception as err:  # noqa: BLE001 - each request gets the error as a 500
            for _, _, future in items:
                future.set_exception(err)
            return
        for (_, _, future), answer in zip(items, answers, strict=True):
            future.set_result(answer)


def build_app(model_dir: str, generator: BatchedGenerator, default_max_tokens: int = 256):
    import asyncio

    from fastapi import FastAPI, HTTPException

    app = FastAPI()
    name = model_dir

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "leap-finetune"}]}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(status_code=400, detail="messages: a non-empty list is required")
        if body.get("stream"):
            raise HTTPException(status_code=400, detail="streaming is not supported by this server")
        options = {
            "max_tokens": int(body.get("max_tokens") or body.get("max_completion_tokens") or default_max_tokens),
            "temperature": float(body.get("temperature") if body.get("temperature") is not None else 1.0),
            "top_p": float(body.get("top_p") if body.get("top_p") is not None else 1.0),
        }
        try:
            answer = await asyncio.wrap_future(generator.submit(messages, options))
        except Exception as err:  # noqa: BLE001
            raise HTTPException(status_code=500, detail=f"{type(err).__name__}: {err}") from None
        return {
            "id": f"leap-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
        }

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m leap_finetune.evaluation.serve", description="Serve one model folder for benchmark generation."
    )
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    import torch
    import uvicorn

    from leap_finetune.models.loading import load_model, load_tokenizer
    from leap_finetune.quiet import quiet_libraries

    quiet_libraries()
    tokenizer = load_tokenizer(args.model, {})
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = load_model(args.model, tokenizer, {}, dtype=dtype).to(args.device).eval()
    app = build_app(args.model, BatchedGenerator(model, tokenizer, args.batch_size))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
