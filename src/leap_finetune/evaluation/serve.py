"""The evaluation server of `async_eval.mode: reserved` where vLLM is not installed: an OpenAI-compatible
chat completions endpoint that answers with the same batched generation as sync mode
(evaluation/generation.py), on one model folder.

    python -m leap_finetune.evaluation.serve MODEL_DIR --port 8100 [--device cuda] [--batch-size 32]

Why our own: `transformers serve` answers one request at a time for LFM2 (its continuous batching has no
cache for LFM2's convolution layers: "Invalid layer type: conv"), so a 200-row benchmark took 148 s on an
H200 where sync mode's batched generation takes ~11 s. Here requests that arrive together are generated
together (up to --batch-size), with the tokenizer's chat template (the snapshot's is the one the benchmarks
render with). Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions (non-streaming), POST
/v1/completions with `prompt_logprobs` (prompt scoring only: distillation's teacher, evaluation/serve_scores.py), and
POST /v1/load_weights {"model": FOLDER}: the weights of another folder of the same architecture (the next
snapshot of a run) loaded into the running model, between two batches (`async_eval.reserved.weight_reload:
in_place`: no new process, no second model in GPU memory). The same reload also answers vLLM's spelling, which
`in_place` sends to either server: POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path":
FOLDER}} and POST /reset_prefix_cache (a no-op here).

A vision-language model (LFM2-VL) also takes OpenAI image parts (`{"type": "image_url", "image_url": {"url":
...}}`: a base64 `data:` URI, an http(s) URL or a local path): each becomes `<image>` in the text and the model's
processor expands it, as sync mode's image benchmarks (evaluation/generation.py). Its processor comes from the
model folder (a snapshot of async evaluation holds it), else from `--processor` (a training checkpoint holds
none: give its base model). A text-only model answers an image part with 400.
"""

from __future__ import annotations

import argparse
import base64
import io
import queue
import sys
import threading
import time
from concurrent.futures import Future

from leap_finetune.data.messages import IMAGE_PLACEHOLDER
from leap_finetune.evaluation.serve_scores import BadRequest, add_completions_endpoint


def read_messages(messages: list) -> tuple[list[dict], list[str]]:
    """Chat messages with string content (text parts joined, `<image>` where each image part was) and the image
    sources in order. Raises BadRequest for a message or part the server does not understand."""
    flat, images = [], []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}]: expected an object with a role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            flat.append({**message, "content": content or ""})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages[{index}].content: expected a string or a list of parts")
        texts = []
        for number, part in enumerate(content):
            where = f"messages[{index}].content[{number}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image_url", "image"):
                source = part.get(kind)
                source = source.get("url") if isinstance(source, dict) else source
                if not isinstance(source, str) or not source:
                    raise BadRequest(f'{where}: an image part needs {{"{kind}": {{"url": ...}}}}')
                images.append(source)
                texts.append(IMAGE_PLACEHOLDER)
            else:
                raise BadRequest(
                    f'{where}: expected a {{"type": "text", "text": ...}} or {{"type": "image_url", "image_url": '
                    f'{{"url": ...}}}} part, got type {kind!r}'
                )
        flat.append({**message, "content": "".join(texts)})
    return flat, images


def decode_image(source: str):
    """An image part's source as an RGB PIL image: a base64 data URI, an http(s) URL or a local path."""
    from PIL import Image

    if source.startswith("data:"):
        header, _, data = source.partition(",")
        if not header.endswith(";base64") or not data:
            raise BadRequest(f"an image data URI must be data:image/...;base64,<data>, got {header[:60]!r}")
        try:
            raw = base64.b64decode(data, validate=True)
            with Image.open(io.BytesIO(raw)) as image:
                return image.convert("RGB")
        except Exception as err:  # noqa: BLE001 - bad base64 or not an image
            raise BadRequest(f"the image data URI ({header}) is not a readable image: {err}") from None
    from leap_finetune.models.vision import open_image

    path = source.removeprefix("file://")
    try:
        return open_image(source if source.startswith(("http://", "https://")) else path)
    except Exception as err:  # noqa: BLE001 - unreachable URL, missing file, not an image
        raise BadRequest(f"cannot read the image {source[:200]!r}: {type(err).__name__}: {err}") from None


class BatchedGenerator:
    """Requests queue up; one thread takes what has arrived (up to batch_size, waiting `gather_s` for more)
    and generates it as one batch per (max_tokens, sampling) setting. `processor`: a vision-language model's,
    for requests with images (None: text only)."""

    def __init__(self, model, tokenizer, batch_size: int, gather_s: float = 0.02, processor=None):
        self.model, self.tokenizer, self.batch_size, self.gather_s = model, tokenizer, batch_size, gather_s
        self.processor = processor
        self.requests: queue.Queue = queue.Queue()
        self.lock = threading.Lock()  # held while a batch generates; a weight reload waits for it
        threading.Thread(target=self._loop, daemon=True, name="leap-serve").start()

    def submit(
        self, messages: list[dict], options: dict, images: list | None = None, tools: list | None = None
    ) -> Future:
        """`messages`: string contents, `<image>` where each of `images` (PIL images, in order) goes; `tools`: the
        request's tool definitions, rendered by the chat template."""
        future: Future = Future()
        self.requests.put((messages, options, future, images or [], tools))
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
            with self.lock:
                for key, items in groups.items():
                    self._generate(dict(key), items)

    def _generate(self, options: dict, items: list) -> None:
        from leap_finetune.evaluation.generation import generate

        start = time.perf_counter()
        images = [item[3] for item in items]
        try:
            prompts = [
                self.tokenizer.apply_chat_template(item[0], tools=item[4], tokenize=False, add_generation_prompt=True)
                for item in items
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
                images=images if any(images) else None,
                processor=self.processor,
            )
        except Exception as err:  # noqa: BLE001 - each request gets the error as a 500
            for _, _, future, *_ in items:
                future.set_exception(err)
            return
        print(
            f"generated {len(items)} answer(s) with {sum(map(len, images))} image(s) in "
            f"{time.perf_counter() - start:.2f} s",
            file=sys.stderr,
            flush=True,
        )
        for (_, _, future, *_), answer in zip(items, answers, strict=True):
            future.set_result(answer)


def tool_call_message(answer: str) -> tuple[dict, str]:
    """An answer with LFM tool calls as an OpenAI message: the calls as tool_calls (arguments as JSON text), the text
    around them as content; an answer whose calls do not parse is returned as text (its finish reason: stop)."""
    import json
    import re

    from leap_finetune.data.tool_calls import CALL_END, CALL_START, find_tool_calls

    blocks = find_tool_calls(answer)
    if blocks.problem is not None or not blocks.calls:
        return {"role": "assistant", "content": answer}, "stop"
    text = re.sub(re.escape(CALL_START) + ".*?" + re.escape(CALL_END), "", answer, flags=re.S).strip()
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        for i, c in enumerate(blocks.calls)
    ]
    return {"role": "assistant", "content": text or None, "tool_calls": calls}, "tool_calls"


def load_weights(generator: BatchedGenerator, folder: str) -> dict:
    """The weights of `folder` (a from_pretrained folder of the served architecture) copied into the served model,
    in place, between two batches; the tokenizer (its chat template) re-read too. Raises BadRequest, naming what
    differs, for a folder that is not one of the same model - the served weights are then unchanged."""
    import json
    from pathlib import Path

    import torch

    from leap_finetune.models.loading import load_model, load_tokenizer

    start = time.perf_counter()
    where = Path(folder)
    if not where.is_dir():
        raise BadRequest(
            f"{folder!r} is not a folder on the server's machine (relative paths are read from {Path.cwd()})"
        )
    if (where / "modules.json").exists():
        raise BadRequest(
            f"{folder!r} is a sentence-transformers (embedding / ColBERT) model, not a chat model; nothing was loaded"
        )
    try:
        architectures = json.loads((where / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError):
        architectures = []
    served_class = type(generator.model).__name__
    if architectures and served_class not in architectures:
        raise BadRequest(
            f"{folder!r} holds a {', '.join(architectures)}, the server runs a {served_class}; nothing was loaded"
        )
    try:
        tokenizer = load_tokenizer(folder, {})
        # read on the CPU in the served dtype: one more copy in host memory, none on the GPU
        dtype = next(generator.model.parameters()).dtype
        new = load_model(folder, tokenizer, {}, dtype=dtype)
    except Exception as err:  # noqa: BLE001 - an unreadable folder is the caller's mistake
        said = str(getattr(err, "message", err)).removeprefix("model_name: ")
        raise BadRequest(f"cannot load the weights of {folder!r}: {said}") from None
    served = generator.model.state_dict()
    incoming = new.state_dict()
    differs = _difference(served, incoming)
    if differs:
        raise BadRequest(f"{folder!r} is not a model of the served architecture ({differs}); nothing was loaded")
    processor = generator.processor
    if processor is not None:  # a vision-language model: the snapshot's processor (its tokenizer, image settings)
        processor = image_processor(folder, None, tokenizer)[0] or processor
    with generator.lock, torch.no_grad():
        for key, value in served.items():
            value.copy_(incoming[key], non_blocking=True)
        if value.is_cuda:
            torch.cuda.synchronize()
        generator.tokenizer, generator.processor = tokenizer, processor
    del new, incoming
    return {"model": folder, "tensors": len(served), "seconds": round(time.perf_counter() - start, 3)}


def _difference(served: dict, incoming: dict) -> str | None:
    """How the folder's weights differ from the served model's (None: same names, shapes and tied weights)."""
    import torch

    missing, extra = sorted(set(served) - set(incoming)), sorted(set(incoming) - set(served))
    shapes = [k for k in set(served) & set(incoming) if served[k].shape != incoming[k].shape]
    shared: dict[int, str] = {}
    for key, value in served.items():  # tied weights (the embeddings and the LM head): one tensor served
        first = shared.setdefault(value.data_ptr(), key)
        if first != key and not shapes and key in incoming and first in incoming:
            if not torch.equal(incoming[first], incoming[key]):
                shapes.append(f"{key} (tied to {first} in the served model, not in the folder)")
    if missing:
        return f"missing {missing[:3]}"
    if extra:
        return f"unexpected {extra[:3]}"
    return f"other shapes for {sorted(shapes)[:3]}" if shapes else None


def build_app(
    model_dir: str, generator: BatchedGenerator, default_max_tokens: int = 256, *, no_images: str | None = None
):
    """`no_images`: why this server takes no image parts (when its generator has no processor)."""
    import asyncio

    from fastapi import FastAPI, HTTPException

    app = FastAPI()
    loaded = {"model": model_dir, "reloads": 0}

    @app.get("/health")
    def health():
        return {"status": "ok", "weights": loaded["model"], "reloads": loaded["reloads"]}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": loaded["model"], "object": "model", "owned_by": "leap-finetune"}]}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        try:
            messages, sources, options, tools = _read_request(body, default_max_tokens)
            if sources and generator.processor is None:
                raise BadRequest(
                    no_images
                    or f"'{model_dir}' is a text-only model: image parts need a vision-language model (LFM2-VL)"
                )
            images = [await asyncio.to_thread(decode_image, source) for source in sources]
        except BadRequest as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        try:
            answer = await asyncio.wrap_future(generator.submit(messages, options, images, tools))
        except Exception as err:  # noqa: BLE001
            raise HTTPException(status_code=500, detail=f"{type(err).__name__}: {err}") from None
        message, finish = {"role": "assistant", "content": answer}, "stop"
        if tools:  # a request with tools gets LFM's calls back as OpenAI tool_calls, as vLLM's lfm2 parser returns them
            message, finish = tool_call_message(answer)
        return {
            "id": f"leap-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": loaded["model"],
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        }

    _add_reload_endpoints(app, generator, loaded)
    add_completions_endpoint(app, generator, loaded)  # (prompt log-probs: distillation's teacher)
    return app


def _read_request(body: dict, default_max_tokens: int) -> tuple[list[dict], list[str], dict, list | None]:
    """A chat completion request as (messages with string content, their image sources, the generation options,
    the tools), or BadRequest."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list is required")
    if body.get("stream"):
        raise BadRequest("streaming is not supported by this server")
    messages, sources = read_messages(messages)
    options = {
        "max_tokens": int(body.get("max_tokens") or body.get("max_completion_tokens") or default_max_tokens),
        "temperature": float(body.get("temperature") if body.get("temperature") is not None else 1.0),
        "top_p": float(body.get("top_p") if body.get("top_p") is not None else 1.0),
    }
    return messages, sources, options, body.get("tools") or None


def _add_reload_endpoints(app, generator: BatchedGenerator, loaded: dict) -> None:
    """POST /v1/load_weights {"model": FOLDER}, and vLLM's developer endpoints, the two requests `weight_reload:
    in_place` sends (evaluation/reserved.py), so the driver reloads this server and vLLM the same way:
    /collective_rpc reload_weights(weights_path=FOLDER), then /reset_prefix_cache (this server keeps no cache)."""
    import asyncio

    from fastapi import HTTPException, Request

    async def body_of(request) -> dict:
        # (the raw request: a body that is not JSON gets the same answer as one without a folder, not FastAPI's 422)
        try:
            body = await request.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    async def load(folder, refused: str) -> dict:
        """`folder`'s weights into the served model (load_weights), or 400 with `refused` / the reason."""
        if not isinstance(folder, str) or not folder:
            raise HTTPException(status_code=400, detail=refused)
        try:
            answer = await asyncio.to_thread(load_weights, generator, folder)
        except BadRequest as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        loaded.update(model=folder, reloads=loaded["reloads"] + 1)
        print(f"loaded the weights of {folder} in {answer['seconds']:.2f} s", file=sys.stderr, flush=True)
        return answer

    async def reload(request):
        return await load((await body_of(request)).get("model"), 'expected {"model": "<a model folder>"}')

    async def collective_rpc(request):
        body = await body_of(request)
        kwargs = body.get("kwargs") if isinstance(body.get("kwargs"), dict) else {}
        refused = 'this server runs one method: {"method": "reload_weights", "kwargs": {"weights_path": FOLDER}}'
        folder = kwargs.get("weights_path") if body.get("method") == "reload_weights" else None
        return {"results": [await load(folder, refused)]}

    for handler, path in ((reload, "/v1/load_weights"), (collective_rpc, "/collective_rpc")):
        handler.__annotations__ = {"request": Request}  # (a class, not the string this module's annotations would be)
        app.post(path)(handler)

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache():
        return {"reset": True}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m leap_finetune.evaluation.serve", description="Serve one model folder for benchmark generation."
    )
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--processor",
        default=None,
        help="a vision-language model's processor (image settings), when the model folder holds none "
        "(a training checkpoint: give its base model)",
    )
    args = parser.parse_args(argv)

    import torch
    import uvicorn

    from leap_finetune.models.loading import load_model, load_tokenizer
    from leap_finetune.quiet import quiet_libraries

    quiet_libraries()
    tokenizer = load_tokenizer(args.model, {})
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = load_model(args.model, tokenizer, {}, dtype=dtype).to(args.device).eval()
    processor, no_images = image_processor(args.model, args.processor, tokenizer)
    if no_images:
        print(f"note: image parts will be refused: {no_images}", file=sys.stderr, flush=True)
    generator = BatchedGenerator(model, tokenizer, args.batch_size, processor=processor)
    app = build_app(args.model, generator, no_images=no_images)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


def image_processor(model: str, processor_source: str | None, tokenizer):
    """(the processor, None) for a vision-language model; (None, why image parts are refused) otherwise."""
    from leap_finetune.errors import LeapError
    from leap_finetune.models.vision import has_processor_files, is_vision_model, load_processor

    if not is_vision_model(model):
        return None, f"'{model}' is a text-only model: image parts need a vision-language model (LFM2-VL)"
    source = processor_source or model
    if not has_processor_files(source):
        return None, (
            f"'{source}' holds no image processor files (processor_config.json / preprocessor_config.json): "
            "start the server with --processor BASE_MODEL"
        )
    try:
        return load_processor(source, tokenizer), None
    except LeapError as err:  # e.g. no torchvision: the server still answers text
        return None, f"the image processor of '{source}' cannot load: {err.message}"


if __name__ == "__main__":
    main()
