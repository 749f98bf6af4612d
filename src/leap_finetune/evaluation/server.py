"""Generation benchmarks against an OpenAI-compatible server (`leap-finetune eval --server URL`): vLLM,
`transformers serve`, llama.cpp's server or a hosted API answer the benchmark prompts through their chat
completions endpoint (the server applies the model's own chat template). Log-prob benchmarks need the
model's token probabilities and always run through transformers.

Rows with images are sent as OpenAI content parts: each user turn (and any turn that had an image) becomes a list
of `{"type": "text", "text": ...}` and `{"type": "image_url", "image_url": {"url": ...}}` parts, in the order
the row had them; a local image file goes as a base64 `data:` URI with its MIME type, an http(s) URL as it is.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import re
from dataclasses import dataclass
from pathlib import Path

from leap_finetune.data.messages import IMAGE_PLACEHOLDER
from leap_finetune.errors import LeapError

FIX = (
    "start the server (e.g. `vllm serve MODEL` or `transformers serve`) and give its base URL, e.g. "
    "http://127.0.0.1:8000/v1"
)


# what a server needs to take a request with `tools` and return LFM's calls as tool_calls (docs/tool-calling.md)
TOOLS_FIX = (
    "a tool_call benchmark sends the rows' tools: serve vLLM with --enable-auto-tool-choice --tool-call-parser lfm2, "
    "llama-server with --jinja"
)


def vllm_tool_flags(resolved) -> list[str]:
    """The flags a vLLM evaluation server needs for the run's tool_call benchmarks (requests with `tools` are refused
    without them): LFM's parser for LFM models (measured: bench/RESULTS.md, issue #29)."""
    benchmarks = resolved.evals.benchmarks if resolved.evals is not None else []
    if resolved.model_family in ("lfm2", "lfm2.5") and any(b.metric == "tool_call" for b in benchmarks):
        return ["--enable-auto-tool-choice", "--tool-call-parser", "lfm2"]
    return []


def vllm_server_flags(resolved) -> list[str]:
    """Every flag of the run's vLLM evaluation server beyond the model and its place: the tool parser the
    benchmarks need, and async_eval's dtype and max_model_len."""
    settings = resolved.async_eval
    flags = vllm_tool_flags(resolved)
    if settings is not None and settings.dtype != "auto":
        flags += ["--dtype", settings.dtype]
    if settings is not None and settings.max_model_len is not None:
        flags += ["--max-model-len", str(settings.max_model_len)]
    return flags


DEFAULT_TIMEOUT_S = 300.0  # one answer (--server-timeout); a server that takes the connection and never answers fails
LIST_TIMEOUT_S = 30.0  # the model list, asked first: a live server answers it at once
PROGRESS_EVERY_S = 15.0


class ServerGenerator:
    """Answers benchmark prompts through the server's /chat/completions, several requests at a time."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key_env: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        try:
            from openai import OpenAI
        except ImportError:
            raise LeapError(
                "--server talks to the server with the `openai` client, which is not installed",
                where="--server",
                fix="pip install 'leap-finetune[serve]' (the openai client and transformers serve)",
            ) from None
        self.base_url = base_url.rstrip("/")
        key = os.environ.get(api_key_env) if api_key_env else os.environ.get("OPENAI_API_KEY")
        # (one retry: the client's default two, at the default 600 s each, kept a silent server waiting 30 minutes)
        self.timeout_s = timeout_s
        self.client = OpenAI(base_url=self.base_url, api_key=key or "not-needed", timeout=timeout_s, max_retries=1)
        self.model = self._served_model(model)

    def _served_model(self, asked: str | None) -> str:
        """The model to ask for: the server's first, or `asked` where the server lists it - asked before anything
        is evaluated, so that a wrong URL, a silent server or a model it does not serve fails here, clearly."""
        try:
            listing = self.client.with_options(timeout=min(LIST_TIMEOUT_S, self.timeout_s), max_retries=0)
            models = [m.id for m in listing.models.list()]
        except Exception as err:  # noqa: BLE001 - connection refused, 404 on a wrong path, auth, no answer
            if asked and getattr(err, "status_code", None) == 404:
                return asked  # (a server without /models: the name is taken as given)
            if _timed_out(err):
                raise LeapError(
                    f"the server at {self.base_url} accepted the connection but did not answer within "
                    f"{min(LIST_TIMEOUT_S, self.timeout_s):.0f} s (asked for its models)",
                    where="--server",
                    fix="look at the server's log: is it still loading the model, or stuck? " + FIX,
                ) from None
            if _refused(err):
                raise LeapError(
                    f"nothing answers at {self.base_url}: the connection was refused (no server listens there)",
                    where="--server",
                    fix="start the server, or check the host and port of the URL; " + FIX,
                ) from None
            hint = ""
            if not self.base_url.startswith(("http://", "https://")):
                hint = f"give the URL with its scheme: http://{self.base_url}; or "
            elif getattr(err, "status_code", None) == 404 and not self.base_url.endswith("/v1"):
                hint = f"a server that answers but not at this path: try {self.base_url}/v1; or "
            raise LeapError(
                f"the server at {self.base_url} did not list its models ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''})",
                where="--server",
                fix=hint + FIX,
            ) from None
        if asked:
            # (servers that take a short name for a listed one: Ollama's `lfm2` for `lfm2:latest`, Gemini's
            # `gemini-x` for `models/gemini-x`)
            aliases = {m.split(":", 1)[0] for m in models} | {m.rsplit("/", 1)[-1] for m in models}
            if asked not in models and asked not in aliases:
                raise LeapError(
                    f"--server-model is '{asked}', but the server at {self.base_url} serves "
                    + (", ".join(f"'{m}'" for m in models[:10]) or "no model"),
                    where="--server-model",
                    fix="give one of the names it lists (vLLM's --served-model-name), or leave --server-model out "
                    "for its first model",
                )
            return asked
        if not models:
            raise LeapError(
                f"the server at {self.base_url} serves no model",
                where="--server",
                fix="load a model on the server, or name it with --server-model",
            )
        return models[0]

    def generate(self, bench_name: str, items, evals, *, tool_calls: bool = False) -> list:
        """The answers' text; with `tool_calls` (metric tool_call) each answer as a ServedTurn: rows with a `tools`
        column send them as OpenAI `tools`, and the calls come back as the server's parser read them."""
        for item in items:  # every image file of the benchmark is there before the first request is sent
            check_images(item, bench_name)

        def one(item):
            options = {"max_tokens": evals.max_new_tokens, "temperature": evals.temperature if evals.do_sample else 0.0}
            if evals.do_sample:
                options["top_p"] = evals.top_p
            if tool_calls and item.tools:
                options["tools"] = openai_tools(item.tools)
            messages = chat_messages(item, bench_name)
            try:
                answer = self.client.chat.completions.create(model=self.model, messages=messages, **options)
            except Exception as err:  # noqa: BLE001 - reported with the row it belongs to
                if _timed_out(err):
                    raise LeapError(
                        f"the server at {self.base_url} did not answer benchmark '{bench_name}' ({item.file}, "
                        f"{item.location}) within {self.timeout_s:.0f} s, twice",
                        where="--server",
                        fix="look at the server's log (overloaded, or stuck?); for slow answers (a CPU server, a "
                        "long max_new_tokens) raise --server-timeout",
                    ) from None
                if tool_calls and _server_side(err):  # (a parser that fails on one answer: that row's result)
                    return ServedTurn("", None, sent_tools="tools" in options, error=_reason(err))
                reason = _reason(err)
                raise LeapError(
                    f"the server at {self.base_url} failed on benchmark '{bench_name}' ({item.file}, "
                    f"{item.location}): {reason}",
                    where="--server",
                    fix=(TOOLS_FIX + "; or " if "tools" in options and "tool" in reason.lower() else "")
                    + "look at the server's log"
                    + ("; image rows need a server with a vision-language model (LFM2-VL)" if item.images else "")
                    + "; "
                    + FIX,
                ) from None
            if not getattr(answer, "choices", None) or getattr(answer.choices[0], "message", None) is None:
                raise LeapError(
                    f"the server at {self.base_url} answered benchmark '{bench_name}' ({item.file}, {item.location}) "
                    "with something that is not a chat completion (no choices[0].message)",
                    where="--server",
                    fix="point --server at an OpenAI-compatible server's base URL (ending in /v1)",
                )
            message = answer.choices[0].message
            content = (message.content or "").strip()  # as local generation's answers
            if not tool_calls:
                return content
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or [] if c.function]
            return ServedTurn(content, calls or None, sent_tools="tools" in options)

        answers = self._answer_all(one, items, bench_name, evals.batch_size)
        failed = [a for a in answers if isinstance(a, ServedTurn) and a.error is not None]
        if failed and len(failed) == len(answers):  # (a server that fails every row is broken, not each answer)
            raise LeapError(
                f"the server at {self.base_url} failed on every row of benchmark '{bench_name}' "
                f"({len(answers)}): {failed[0].error}",
                where="--server",
                fix="look at the server's log; " + TOOLS_FIX,
            )
        return answers

    def _answer_all(self, one, items, bench_name: str, parallel: int) -> list:
        """Each item's answer, in order, several requests at a time, with a progress line every PROGRESS_EVERY_S
        seconds (a slow server is seen to be slow, not silent). The first failure is raised at once: the requests
        still running are left to daemon threads, which nothing waits for (a ThreadPoolExecutor's workers are
        joined when its `with` block ends and again when the interpreter exits, so a failure against a silent
        server came one whole timeout late, after the last progress line)."""
        import queue
        import sys
        import threading
        import time

        todo: queue.SimpleQueue = queue.SimpleQueue()
        for index, item in enumerate(items):
            todo.put((index, item))
        outcomes: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()

        def work() -> None:
            while not stop.is_set():
                try:
                    index, item = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    outcomes.put((index, one(item), None))
                except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
                    outcomes.put((index, None, err))

        for _ in range(min(max(1, parallel), len(items))):
            threading.Thread(target=work, name=f"eval-server-{bench_name}", daemon=True).start()
        answers: list = [None] * len(items)
        answered, start = 0, time.monotonic()
        last = start
        try:
            while answered < len(items):
                try:
                    index, answer, err = outcomes.get(timeout=max(0.01, last + PROGRESS_EVERY_S - time.monotonic()))
                except queue.Empty:
                    pass
                else:
                    if err is not None:
                        raise err
                    answers[index], answered = answer, answered + 1
                if time.monotonic() - last >= PROGRESS_EVERY_S and answered < len(items):
                    last = time.monotonic()
                    print(
                        f"benchmark '{bench_name}': {answered}/{len(items)} answered by {self.base_url} "
                        f"({last - start:.0f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            stop.set()  # (the threads take no new row; a request under way ends with its timeout, unwaited)
        return answers


def _timed_out(err: Exception) -> bool:
    return type(err).__name__ in ("APITimeoutError", "ReadTimeout", "TimeoutException") or isinstance(err, TimeoutError)


@dataclass
class ServedTurn:
    """A tool_call benchmark's answer from the server: its text, and the tool calls its parser returned
    ([(name, arguments as JSON text)], None when it returned none)."""

    content: str
    calls: list[tuple[str, str]] | None
    sent_tools: bool  # the row's tools went as OpenAI `tools`
    error: str | None = None  # the server failed on this row (an answer its parser could not read)


def openai_tools(tools: list) -> list[dict]:
    """Tool definitions as OpenAI's `tools` field: {"type": "function", "function": schema} (bare schemas wrapped,
    JSON text read)."""
    out = []
    for tool in tools:
        if isinstance(tool, str):
            tool = json.loads(tool)
        if "function" in tool:  # OpenAI's form (with or without its "type")
            out.append({"type": "function", **tool})
        else:
            out.append({"type": "function", "function": tool})
    return out


def _server_side(err: Exception) -> bool:
    """A 500 (the server took the request and failed on its answer: a tool parser that cannot read it), not a refused
    connection, a bad request, or an unavailable server or gateway (502-504: the server is down, not the row)."""
    return getattr(err, "status_code", None) == 500


def _reason(err: Exception) -> str:
    """The client's error with what the server said (the openai client's text is only "Error code: 400" for
    a body it does not know, e.g. FastAPI's {"detail": ...})."""
    text = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        error = body.get("error")
        said = body.get("detail") or (error.get("message") if isinstance(error, dict) else error) or body.get("message")
        if isinstance(said, str) and said and said not in text:
            text += f" ({said})"
    return text


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def check_images(item, bench_name: str) -> None:
    """The row's image files are readable and each image has its `<image>` in the prompt (a text part that
    itself holds `<image>` would put the images out of place)."""
    if not item.images:
        return
    placeholders = sum(turn["content"].count(IMAGE_PLACEHOLDER) for turn in item.prompt)
    if placeholders != len(item.images):
        raise LeapError(
            f"benchmark '{bench_name}' ({item.file}, {item.location}): the prompt has {placeholders} "
            f"'{IMAGE_PLACEHOLDER}' for {len(item.images)} image(s), so the images cannot be put in their place",
            where=f"{item.file}, {item.location}",
            fix=f"remove the literal '{IMAGE_PLACEHOLDER}' from the row's text parts",
        )
    for source in item.images:
        if is_url(source) or _inline(source):
            continue
        if not (Path(source).is_file() and os.access(source, os.R_OK)):
            raise LeapError(
                f"benchmark '{bench_name}' ({item.file}, {item.location}): the image file {source} cannot be "
                "read (it is gone, or not readable): nothing was sent to the server",
                where=f"{item.file}, {item.location}",
                fix="put the image back at that path (relative paths start at the benchmark file's folder), or "
                "correct the row",
            )


def chat_messages(item, bench_name: str = "") -> list[dict]:
    """The row's prompt as chat messages for the server: text as it is; with images, each user turn (and any
    turn with an image) as a list of text and image_url parts, each image where its `<image>` stands."""
    if not item.images:
        return item.prompt
    images = iter(item.images)
    messages = []
    for turn in item.prompt:
        pieces = turn["content"].split(IMAGE_PLACEHOLDER)
        if len(pieces) == 1 and turn["role"] != "user":
            messages.append(turn)
            continue
        parts = []
        for index, text in enumerate(pieces):
            if index:
                parts.append(image_part(next(images), item, bench_name))
            if text:
                parts.append({"type": "text", "text": text})
        messages.append({**turn, "content": parts})
    return messages


def image_part(source: str, item=None, bench_name: str = "") -> dict:
    """An OpenAI image part: an http(s) URL as it is; a local file, or an image a row holds inline (a data URI
    or base64 text), as a base64 data URI with its MIME type."""
    if is_url(source):
        return {"type": "image_url", "image_url": {"url": source}}
    where = f"{item.file}, {item.location}" if item is not None else source[:80]
    prefix = f"benchmark '{bench_name}' ({where}): " if item is not None else ""
    inline = _inline(source)
    if inline:
        try:
            data = base64.b64decode(inline)
        except ValueError:
            data = b""
        shown = "the row's inline image (data URI / base64 text)"
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as err:
            raise LeapError(
                f"{prefix}cannot read the image file {source} ({err.strerror or err})",
                where=where,
                fix="put the image back at that path, or correct the row",
            ) from None
        shown = source
    mime = _mime_type("" if inline else source, data)
    if mime is None:
        raise LeapError(
            f"{prefix}{shown} is not an image (not a format PIL can read)",
            where=where,
            fix="give an image (PNG, JPEG, WebP, ...)",
        )
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}}


def _inline(source: str) -> str | None:
    """The base64 text of an image a row holds inline (a `data:` URI, or base64 text: 200+ characters of the
    base64 alphabet are no path anyone writes), None for a file path."""
    if source.startswith("data:"):
        return source.partition(",")[2]
    if len(source) >= 200 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", source[:400]):
        return source
    return None


def _mime_type(path: str, data: bytes) -> str | None:
    """From the file name (photo.jpg: image/jpeg), else from the content (a file without a known suffix)."""
    guessed = mimetypes.guess_type(path)[0] if path else None
    if guessed and guessed.startswith("image/"):
        return guessed
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return Image.MIME.get(image.format or "")
    except (UnidentifiedImageError, OSError):
        return None


def _refused(err: BaseException) -> bool:
    """A connection refused, however deep the client library wrapped it (openai -> httpx -> OSError)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, ConnectionRefusedError):
            return True
        err = err.__cause__ or err.__context__
    return False
