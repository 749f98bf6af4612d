"""Chat templates: LiquidAI's official ones, chosen from the model family.

We render with the official templates exactly as LiquidAI ships them; TRL keeps byte-identical
copies (and `{% generation %}`-marked training variants whose rendered text is the same) in
`trl/chat_templates/`, checked weekly against the Hub, so we read them from there rather than
keeping a third copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.errors import LeapError

# name -> (official template file, the same template with {% generation %} markers around what the
# assistant produces). LFM2.5's official template already carries the markers.
BUILTIN_TEMPLATES = {
    "lfm2": ("lfm2_v2.jinja", "lfm2_v2_training.jinja"),  # LiquidAI/LFM2-* today
    "lfm2-v1": ("lfm2.jinja", "lfm2_training.jinja"),  # LFM2 as first released
    "lfm2.5": ("lfm2_2_5_v2.jinja", "lfm2_2_5_v2.jinja"),  # LiquidAI/LFM2.5-*
}
FAMILY_TEMPLATE = {"lfm2": "lfm2", "lfm2.5": "lfm2.5", "other": "model"}
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _trl_template(file: str) -> str:
    return (resources.files("trl") / "chat_templates" / file).read_text(encoding="utf-8")


def official_template(name: str) -> str:
    return _trl_template(BUILTIN_TEMPLATES[name][0])


def resolve_chat_template(value: str | None, family: str, base: Path, where: str) -> str:
    """A built-in name, "model" (the tokenizer's own), or an absolute path to a .jinja file."""
    if value is None:
        return FAMILY_TEMPLATE[family]
    if value in BUILTIN_TEMPLATES or value == "model":
        return value
    from leap_finetune.config.paths import local_path

    path = local_path(value, base)
    if path.is_file():
        return str(path.resolve())
    names = [*BUILTIN_TEMPLATES, "model"]
    hint = did_you_mean(value, names)
    raise LeapError(
        f"chat_template '{value}' is neither a built-in template nor an existing file",
        where=f"{where}: chat_template",
        fix=(hint + " " if hint else "") + f"use one of {', '.join(names)}, or a path to a .jinja file",
    )


@dataclass(frozen=True)
class ChatTemplate:
    """What to render with (`text`) and what to compute loss masks with (`training`)."""

    name: str
    text: str  # the template a user of the trained model will use
    training: str | None  # the same rendering with {% generation %} markers; None if unknown


def load_chat_template(resolved: str, tokenizer) -> ChatTemplate:
    if resolved in BUILTIN_TEMPLATES:
        official, training = BUILTIN_TEMPLATES[resolved]
        return ChatTemplate(resolved, _trl_template(official), _trl_template(training))
    if resolved == "model":
        text = tokenizer.chat_template
        if not text:
            raise LeapError(
                "the model's tokenizer has no chat template",
                where="chat_template",
                fix="set `chat_template:` to lfm2, lfm2.5 or a .jinja file",
            )
    else:
        try:
            text = Path(resolved).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise LeapError(
                f"cannot read the chat template: {err}",
                where=f"chat_template: {resolved}",
                fix="save the template as UTF-8 text",
            ) from None
    _check_syntax(text, resolved if resolved not in ("model",) else "the tokenizer's chat template")
    return ChatTemplate(resolved, text, _training_variant(text, tokenizer))


def _check_syntax(text: str, where: str) -> None:
    """A Jinja syntax error is the template author's: say where it is. Compiled the way transformers
    compiles chat templates (its environment knows {% generation %} blocks)."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as err:
        raise LeapError(
            f"the chat template is not valid Jinja: {err.message} (template line {err.lineno})",
            where=f"chat_template: {where}",
            fix="correct the template at that line",
        ) from None


def _training_variant(text: str, tokenizer) -> str | None:
    if _GENERATION.search(text):
        return text
    # TRL knows {% generation %}-marked variants of common templates (Qwen, Llama, Gemma, ...).
    try:
        from trl.chat_template_utils import get_training_chat_template

        previous = tokenizer.chat_template
        tokenizer.chat_template = text
        try:
            return get_training_chat_template(tokenizer)
        finally:
            tokenizer.chat_template = previous
    except Exception:  # noqa: BLE001 - unknown template: no assistant masks available
        return None


def render_family(chat_template: str, model_family: str) -> str:
    """The LFM family whose conventions the rendered text follows: the chosen built-in template's,
    else the model's."""
    if chat_template in BUILTIN_TEMPLATES:
        return "lfm2.5" if chat_template == "lfm2.5" else "lfm2"
    return model_family


def family_of_template(text: str | None) -> str | None:
    """Which LFM family a template file belongs to (used to recognise fine-tuned checkpoints)."""
    if not text:
        return None
    for name, (official, training) in BUILTIN_TEMPLATES.items():
        if text in (_trl_template(official), _trl_template(training)):
            return "lfm2.5" if name == "lfm2.5" else "lfm2"
    return None


THINKING_FIELDS = ("thinking", "reasoning", "reasoning_content")


def renders_thinking(chat_template: str) -> bool | None:
    """Whether the chosen template renders an assistant message's `thinking` (or `reasoning_content`) field:
    LFM2.5's does (the last turns' reasoning as <think>...</think>), LFM2's does not (it would drop the field
    without a word); a .jinja file by whether it reads the field; the tokenizer's own: unknown here (None)."""
    if chat_template in BUILTIN_TEMPLATES:
        return chat_template == "lfm2.5"
    if chat_template == "model":
        return None
    try:
        text = Path(chat_template).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return any(field in text for field in THINKING_FIELDS)
