"""Chat rendering and loss masks.

A conversation is rendered with the chat template; the `{% generation %}` markers of the training
variant give the character spans the assistant produces (content + `<|im_end|>`). Tokens are
trained when they overlap such a span. Working in characters keeps `inspect` exact: it shows the
rendered text and the spans that carry loss, with no decode round-trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.utils.chat_template_utils import render_jinja_template

from leap_finetune.data.chat_templates import ChatTemplate
from leap_finetune.errors import LeapError

IGNORE_INDEX = -100


@dataclass
class TokenizedRow:
    text: str  # the full rendered string, special tokens included
    input_ids: list[int]  # after truncation to max_length
    labels: list[int]  # IGNORE_INDEX where no loss
    trained_spans: list[tuple[int, int]]  # character spans of `text` whose tokens carry loss (after truncation)
    truncated_at: int | None = None  # character offset where max_length cut the text, if it did
    trained_tokens_lost: int = 0  # trained tokens removed by truncation
    meta: dict = field(default_factory=dict)

    @property
    def trained_tokens(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)

    @property
    def tokens(self) -> int:
        return len(self.input_ids)

    def columns(self) -> dict:
        """What the SFT trainer reads."""
        return {"input_ids": self.input_ids, "labels": self.labels}

    def inspect(self) -> dict:
        item = {"text": self.text, "trained_spans": [list(span) for span in self.trained_spans]}
        if self.truncated_at is not None:
            item["truncated_at"] = self.truncated_at
        return item


@dataclass
class TokenizedCompletion:
    """A prompt and one completion, rendered as one conversation and split where the completion starts."""

    prompt_text: str
    completion_text: str
    prompt_ids: list[int]
    completion_ids: list[int]


class Renderer:
    """Renders, masks and tokenizes one conversation at a time."""

    def __init__(self, tokenizer, template: ChatTemplate, loss_on: str, max_length: int | None,
                 truncation_mode: str = "keep_start"):
        if loss_on != "all" and template.training is None:
            raise LeapError(
                f"the chat template '{template.name}' has no {{% generation %}} markers, so the assistant's "
                "tokens cannot be found for the loss mask",
                where="chat_template",
                fix="wrap the assistant output in {% generation %}...{% endgeneration %} in your template, "
                "or set training_config.loss_on: all",
            )
        self.tokenizer = tokenizer
        self.template = template
        self.loss_on = loss_on
        self.max_length = max_length
        self.truncation_mode = truncation_mode
        self._special = {
            "bos_token": tokenizer.bos_token or "",
            "eos_token": tokenizer.eos_token or "",
            "pad_token": tokenizer.pad_token or "",
        }

    def render(self, messages: list[dict], tools: list | None = None,
               add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character spans the assistant produces."""
        if self.loss_on == "all" or add_generation_prompt:
            rendered, _ = render_jinja_template(
                conversations=[messages], tools=tools, chat_template=self.template.text,
                add_generation_prompt=add_generation_prompt, **self._special,
            )
            text = rendered[0]
            return text, ([(0, len(text))] if self.loss_on == "all" else [])
        rendered, indices = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=self.template.training,
            return_assistant_tokens_mask=True, **self._special,
        )
        text = rendered[0]
        spans = [self._end_at_eos(text, start, end) for start, end in indices[0] if end > start]
        if self.loss_on == "final_assistant":
            spans = spans[-1:]
        return text, spans

    def _end_at_eos(self, text: str, start: int, end: int) -> tuple[int, int]:
        # The templates put the newline that separates turns inside the generation block; the model
        # stops at <|im_end|> and never generates it, so it carries no loss.
        eos = self._special["eos_token"]
        if eos and text[start:end].endswith(eos + "\n"):
            end -= 1
        return start, end

    def prompt_text(self, messages: list[dict], tools: list | None = None) -> str:
        """The conversation up to the generation prompt, as the model sees it at inference."""
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=self.template.text, add_generation_prompt=True,
            **self._special,
        )
        return rendered[0]

    def tokenize(self, messages: list[dict], tools: list | None = None) -> TokenizedRow:
        text, spans = self.render(messages, tools)
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        trained = [_overlaps(start, end, spans) for start, end in offsets]
        truncated_at, lost = None, 0
        if self.max_length is not None and len(ids) > self.max_length:
            keep = slice(None, self.max_length) if self.truncation_mode == "keep_start" else slice(-self.max_length, None)
            lost = sum(trained) - sum(trained[keep])
            truncated_at = offsets[self.max_length][0] if self.truncation_mode == "keep_start" else offsets[-self.max_length][0]
            ids, offsets, trained = ids[keep], offsets[keep], trained[keep]
        labels = [token if on else IGNORE_INDEX for token, on in zip(ids, trained, strict=True)]
        return TokenizedRow(
            text=text,
            input_ids=list(ids),
            labels=labels,
            trained_spans=_merge(offset for offset, on in zip(offsets, trained, strict=True) if on),
            truncated_at=truncated_at,
            trained_tokens_lost=lost,
        )


def split_completion(renderer: "Renderer", prompt: list[dict], completion: list[dict],
                     tools: list | None, prompt_text: str | None = None) -> TokenizedCompletion:
    """Render prompt + completion with the official template and cut it where the completion starts.

    The prompt text is what the model sees at inference (the template's generation prompt included);
    the completion is what follows: the assistant's turn(s) up to and including the end-of-turn token.
    Both come from one tokenization of the whole text, so the token boundary is exactly what
    training sees."""
    prompt_text = prompt_text if prompt_text is not None else renderer.prompt_text(prompt, tools)
    full_text, _ = render_jinja_template(
        conversations=[prompt + completion], tools=tools, chat_template=renderer.template.text, **renderer._special
    )
    full_text = full_text[0]
    if not full_text.startswith(prompt_text):
        raise LeapError(
            "the chat template renders the prompt differently on its own than followed by the completion, so the "
            "completion cannot be separated from it",
            where="chat_template",
            fix="use a prefix-preserving chat template (the built-in LFM templates are)",
        )
    completion_text = full_text[len(prompt_text):]
    eos = renderer._special["eos_token"]
    if eos and completion_text.endswith(eos + "\n"):  # the turn separator is never generated (see _end_at_eos)
        completion_text = completion_text[:-1]
    encoding = renderer.tokenizer(prompt_text + completion_text, add_special_tokens=False, return_offsets_mapping=True)
    boundary = len(prompt_text)
    # A token that straddles the boundary goes to the completion, so no completion text goes untrained.
    cut = next((i for i, (_, end) in enumerate(encoding["offset_mapping"]) if end > boundary), len(encoding["input_ids"]))
    ids = list(encoding["input_ids"])
    return TokenizedCompletion(prompt_text, completion_text, ids[:cut], ids[cut:])


def _overlaps(start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    return end > start and any(start < span_end and end > span_start for span_start, span_end in spans)


def _merge(offsets) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in offsets:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]
