"""Chat messages and their content parts: the one parser behind SFT, preference (DPO/KTO), GRPO and
benchmark rows.

Every problem goes through `problem(field, text)`, naming the field (`messages[2].content[0]`) and what
was expected; the row modules wrap it into a RowProblem with the file and row. A content value is a
string or a list of typed parts; `parse_content` joins the text parts into one string (what LFM2.5's
template does itself, and what LFM2's would otherwise JSON-dump verbatim into the prompt) and returns
image parts apart, as `ImageRef`s, with `IMAGE_PLACEHOLDER` standing in the text where each was. Whether
image parts are taken at all is the caller's choice (`image_folder` / `images`): benchmark rows take them,
and training rows of a vision-language run (SFT, DPO) in user turns.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leap_finetune.config.suggest import did_you_mean

MESSAGE_COLUMNS = ("messages", "conversations", "conversation", "chat")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "tool": "tool",
    "user": "user",
    "assistant": "assistant",
}
# Passed through to the chat template: LFM2.5 reads `thinking`; structured tool calls are rendered
# by both LFM templates.
EXTRA_MESSAGE_KEYS = ("tool_calls", "name", "tool_call_id", "thinking", "reasoning", "reasoning_content")
TOOLS_COLUMN = "tools"
# LFM2-VL's processor expands each `<image>` in the text into that image's tokens, in order, so the text
# keeps one where each image part was.
IMAGE_PLACEHOLDER = "<image>"
# Part types that need a model with another modality: named as such for a text-only caller, rather than
# "unknown part type".
MEDIA_PART_TYPES = ("image", "image_url", "audio", "video")

Problem = Callable[[str, str], None]  # problem(field, text)


@dataclass(frozen=True)
class ImageRef:
    source: str  # a file path (resolved against the data file's folder) or an http(s) URL, fetched when used
    field: str  # the part it came from, e.g. messages[0].content[1], for problems found later (decoding)


@dataclass
class Content:
    text: str  # the text parts joined, IMAGE_PLACEHOLDER where each image part was
    images: list[ImageRef] = dataclasses.field(default_factory=list)


def describe_value(value: Any) -> str:
    """A value as a problem shows it: `got a string ('abc')`, `got null`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def check_tools(tools: Any, from_text_table: bool, problem: Problem) -> list | None:
    """The optional `tools` column: a list of tool definitions (JSON schemas), or its JSON text."""
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):  # (JSON text: a CSV cell, or a JSONL row that stores it so)
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            problem(TOOLS_COLUMN, f"expected JSON text holding a list of tool definitions ({err.msg})")
            return None
    if not isinstance(tools, list):
        problem(TOOLS_COLUMN, f"expected a list of tool definitions (JSON schemas), got {describe_value(tools)}")
        return None
    parsed = []
    for index, tool in enumerate(tools):
        if isinstance(tool, str):
            try:
                tool = json.loads(tool)
            except json.JSONDecodeError:
                problem(f"{TOOLS_COLUMN}[{index}]", "a string that is not a JSON tool definition")
                return None
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            problem(
                f"{TOOLS_COLUMN}[{index}]",
                "expected a tool definition with a 'name' "
                '(e.g. {"name": "get_weather", "parameters": {...}} or OpenAI\'s '
                '{"type": "function", "function": {...}})',
            )
            return None
        parsed.append(tool)
    return parsed


def check_message(message: Any, field: str, problem: Problem, *, images: ImageParts | None = None) -> dict | None:
    """One training message, normalised (ShareGPT `from`/`value` resolved, content as one string), or None
    after reporting what is wrong with it. With `images` (a vision-language run) a user or tool turn may hold
    image parts: they are appended to `images.found`, `<image>` standing where each was."""
    if not isinstance(message, dict):
        problem(field, f"expected an object with 'role' and 'content', got {describe_value(message)}")
        return None
    message = dict(message)
    if "role" not in message and "from" in message:  # ShareGPT
        sharegpt_role = message.pop("from")
        message["role"] = SHAREGPT_ROLES.get(sharegpt_role, sharegpt_role)
        if "value" in message and "content" not in message:
            message["content"] = message.pop("value")
    known = ("role", "content", *EXTRA_MESSAGE_KEYS)
    for key in message:
        if key not in known:
            hint = did_you_mean(str(key), known)
            problem(f"{field}.{key}", f"unknown message key '{key}' ({hint or 'expected role, content'})")
            return None
    role = message.get("role")
    if role is None:
        problem(f"{field}.role", "missing: every message needs a role (system, user, assistant or tool)")
        return None
    if role not in ROLES:
        hint = did_you_mean(str(role), ROLES)
        problem(
            f"{field}.role",
            f"'{role}' is not a role; expected one of {', '.join(ROLES)}" + (f" ({hint})" if hint else ""),
        )
        return None
    calls_tools = role == "assistant" and bool(message.get("tool_calls"))
    if "content" not in message:
        if calls_tools:
            message["content"] = ""
        else:
            problem(f"{field}.content", "missing: every message needs content (a string or a list of typed parts)")
            return None
    if message["content"] is None and not calls_tools:
        article = "an" if role == "assistant" else "a"
        problem(
            f"{field}.content",
            f"null: {article} {role} message needs content (only an assistant message "
            "with at least one tool call in tool_calls may have content null)",
        )
        return None
    # (null content of a tool-calling assistant turn: the template renders it as empty text)
    raw = "" if message["content"] is None else message["content"]
    takes_images = images is not None and role in ("user", "tool")
    if images is not None and not takes_images and _has_image_part(raw):
        where = "the system prompt" if role == "system" else "an assistant turn"
        problem(
            f"{field}.content",
            f"{where} cannot hold an image (the model reads images in user turns; it never generates them); "
            "its content must be text: a string or text parts",
        )
        return None
    content = parse_content(raw, f"{field}.content", problem, images=images if takes_images else None)
    if content is None:
        return None
    if images is not None and not takes_images and IMAGE_PLACEHOLDER in content.text:
        # (in a vision-language run it is the image token: the model would look for a picture there)
        problem(
            f"{field}.content",
            f"the text holds '{IMAGE_PLACEHOLDER}', the model's image token; images go in user turns as image parts "
            "- reword the text",
        )
        return None
    if images is not None and takes_images:
        images.found.extend(content.images)
    if role == "assistant" and not (content.text.strip() or message.get("tool_calls") or message.get("thinking")):
        problem(f"{field}.content", "the assistant message is empty: it would train the model to answer with nothing")
        return None
    message["content"] = content.text
    return message


@dataclass
class ImageParts:
    """How a caller that takes images reads image parts: `folder` is where relative paths start (the data file's
    folder, or dataset.image_root); `column` the row's `images` list, which parts without a source take in order
    (the Hugging Face / TRL layout: {"type": "image"} in the messages, the pictures in an `images` column)."""

    folder: Path
    column: list | None = None
    column_field: str = "images"
    found: list[ImageRef] = dataclasses.field(default_factory=list)
    taken: int = 0  # entries of `column` taken so far


def _has_image_part(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") in ("image", "image_url") for part in content
    )


def parse_content(
    content: Any,
    field: str,
    problem: Problem,
    *,
    image_folder: Path | None = None,
    images: ImageParts | None = None,
) -> Content | None:
    """A message's content: a string, or a list of typed parts ({"type": "text", "text": ...}; for a caller that
    takes images, also {"type": "image", "image": a path, a data URI or base64 text, or an http(s) URL}). None after
    reporting the first bad part.

    `image_folder` (or `images`, with a row's `images` column) is where relative image paths start: a caller that
    takes images gives it; without it an image part is refused (text training)."""
    if images is None and image_folder is not None:
        images = ImageParts(image_folder)
    if isinstance(content, str):
        if images is not None and IMAGE_PLACEHOLDER in content:
            problem(
                field,
                f"the text holds '{IMAGE_PLACEHOLDER}', the model's image token: write an image part "
                '{"type": "image", "image": path} instead',
            )
            return None
        return Content(content)
    if not isinstance(content, list):
        problem(field, f"expected a string or a list of typed parts, got {describe_value(content)}")
        return None
    texts, found = [], []
    for index, part in enumerate(content):
        part_field = f"{field}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if images is not None and IMAGE_PLACEHOLDER in part["text"]:
                problem(
                    f"{part_field}.text",
                    f"the text holds '{IMAGE_PLACEHOLDER}', the model's image token: write an image part "
                    '{"type": "image", "image": path} instead',
                )
                return None
            texts.append(part["text"])
        elif kind in ("image", "image_url") and images is not None:
            image = _image(part, part_field, images, problem)
            if image is None:
                return None
            found.append(image)
            texts.append(IMAGE_PLACEHOLDER)
        else:
            problem(*_refusal(part, part_field, takes_images=images is not None))
            return None
    return Content("".join(texts), found)


def _image(part: dict, field: str, images: ImageParts, problem: Problem) -> ImageRef | None:
    source = part.get("image") if "image" in part else part.get("path") or part.get("url")
    if part.get("type") == "image_url":  # OpenAI's {"type": "image_url", "image_url": {"url": ...}}
        inner = part.get("image_url")
        source = inner.get("url") if isinstance(inner, dict) else inner
    if source is None:
        if images.column is None or images.taken >= len(images.column):
            have = 0 if images.column is None else len(images.column)
            problem(
                field,
                "an image part needs 'image': a file path, a data URI or base64 text"
                + (f" (the row's '{images.column_field}' column has {have} image(s) for more parts)" if have else ""),
            )
            return None
        source = images.column[images.taken]
        field = f"{images.column_field}[{images.taken}]"
        images.taken += 1
    source = image_source(source)
    if not isinstance(source, str) or not source:
        problem(
            field,
            f"an image part needs 'image': a file path, a data URI or base64 text, got {describe_value(source)}",
        )
        return None
    if source.startswith(("http://", "https://", "data:")) or looks_base64(source):
        return ImageRef(source, field)  # decoded (URLs fetched) when checked: a row is parsed without the network
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", source)
    if scheme:  # (s3://, gs://, file://: read as a relative path, it was "not found" in the data file's folder)
        problem(
            field,
            f"an image given as a {scheme.group(1)}:// address ({source[:80]}): leap-finetune reads image files, "
            "data URIs and http(s) URLs",
        )
        return None
    path = images.folder / Path(source).expanduser()  # (~/x.jpg: the home folder's; an absolute path stays itself)
    try:
        found = path.is_file()
    except OSError:  # a name too long for the file system: neither a path nor base64 of a known image format
        found = False
    if not found and _is_folder(path):
        problem(field, f"{path} is a folder, not an image file: give the path of one image in it")
        return None
    if not found:
        shown = str(path) if len(source) <= 200 else f"{source[:40]}... ({len(source)} characters)"
        problem(
            field,
            f"image file not found: {shown}"
            + (
                " (nor base64 of a PNG, JPEG, GIF, WebP, BMP or TIFF file: give it as a data URI, "
                "data:image/png;base64,...)"
                if len(source) > 200
                else _relative_hint(source, images.folder)
            ),
        )
        return None
    return ImageRef(str(path), field)


def _relative_hint(source: str, folder: Path) -> str:
    """Where a relative path was looked for, and the current folder's file of that name (paths written relative to
    where the user ran the command: every row fails alike, so the way out is one key)."""
    keys = "dataset.image_root; a benchmark's image_root or evals.image_root"
    if Path(source).expanduser().is_absolute():
        return ""
    here = Path.cwd() / source
    try:
        elsewhere = here.is_file() and here.resolve() != (folder / source).resolve()
    except OSError:  # (a name longer than the file system takes)
        elsewhere = False
    if elsewhere:
        return (
            f"; relative image paths start at {folder} (the data file's folder, or the image_root key), and "
            f"{here} exists: set image_root: {Path.cwd()} ({keys})"
        )
    return f" (relative image paths start at {folder}: the data file's folder, or the image_root key - {keys})"


def image_source(value: Any) -> Any:
    """An image as a string: a path or URL as given; bytes ({"bytes": ...} of a Parquet / Hub image column, or raw)
    and decoded pictures (PIL, what a Hub dataset's Image column yields) as a data URI, so that every image of the
    prepared rows is one string the batches can read back."""
    import base64

    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return "data:image;base64," + base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "save") and hasattr(value, "size"):  # a PIL image
        import io

        # (its own format where Pillow can write it - a JPEG photo stays a JPEG - else PNG of its RGB)
        fmt = value.format if value.format in ("JPEG", "PNG", "WEBP") else "PNG"
        if fmt == "PNG" and value.mode not in ("RGB", "RGBA", "L", "LA", "P", "1", "I", "I;16"):
            value = value.convert("RGB")  # (CMYK and others: not writable as PNG)
        buffer = io.BytesIO()
        value.save(buffer, format=fmt)
        return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return value


def looks_base64(source: str) -> bool:
    """Base64 text of an image without a data URI prefix: the base64 alphabet only, and its first bytes decode to an
    image file's signature (PNG, JPEG, GIF, WebP, BMP, TIFF) - a file name never does."""
    import binascii
    import re

    head = source[:64].strip()
    if len(head) < 16 or re.fullmatch(r"[A-Za-z0-9+/=_-]+", head) is None:
        return False
    try:
        start = b64decode(head[: len(head) // 4 * 4])
    except (binascii.Error, ValueError):
        return False
    return start.startswith(IMAGE_SIGNATURES)


def b64decode(text: str) -> bytes:
    """Base64 in the standard or the URL-safe alphabet."""
    import base64

    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return base64.b64decode(text + "=" * (-len(text) % 4))


# the first bytes of the image files Pillow reads for LFM2-VL
IMAGE_SIGNATURES = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM", b"II*\x00", b"MM\x00*")


def _refusal(part: Any, field: str, *, takes_images: bool) -> tuple[str, str]:
    """(field, text) for a part the caller does not take. A caller that takes images says in one line what
    both kinds of part look like; a text-only caller says what is wrong with this part, and that media parts
    need another model rather than that they are unknown."""
    if takes_images:
        return field, 'expected {"type": "text", "text": ...} or {"type": "image", "image": path}'
    if not isinstance(part, dict) or "type" not in part:
        return field, (f'expected a typed part like {{"type": "text", "text": "..."}}, got {describe_value(part)}')
    if part["type"] == "text":
        return f"{field}.text", f"a text part needs a string 'text', got {describe_value(part.get('text'))}"
    if part["type"] in MEDIA_PART_TYPES:
        if part["type"] in ("image", "image_url"):
            return field, (
                "an image part needs a vision-language model (model_name: an LFM2-VL model such as "
                "LiquidAI/LFM2-VL-450M) and training_type sft, dpo or grpo; this run reads text only"
            )
        return field, f"a '{part['type']}' part needs an audio/video model; leap-finetune trains on text and images"
    return field, f"unknown part type '{part['type']}'; expected 'text'"


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False
