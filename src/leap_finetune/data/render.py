"""Chat rendering and loss masks.

A conversation is rendered with the chat template; the `{% generation %}` markers of the training
variant give the character spans the assistant produces (content + `<|im_end|>`). Tokens are
trained when they overlap such a span. Working in characters keeps `inspect` exact: it shows the
rendered text and the spans that carry loss, with no decode round-trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
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

    def __init__(
        self,
        tokenizer,
        template: ChatTemplate,
        loss_on: str,
        max_length: int | None,
        truncation_mode: str = "keep_start",
    ):
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
        self.loss_on_thinking = True  # training_config.loss_on_thinking: false leaves <think>...</think> untrained
        self.max_length = max_length
        self.truncation_mode = truncation_mode
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        if backend is not None:
            # A copy without the padding / truncation a tokenizer.json may carry: `tokenizer(text)` turns those
            # off for its own call, a direct encode_batch would apply them.
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(backend.to_str())
            backend.no_padding()
            backend.no_truncation()
        self.backend = backend
        # Offsets trimmed by a post-processor (RoBERTa-style trim_offsets) can leave gaps and empty tokens
        # inside a span, which the boundary shortcut of tokenize_many would count: use every offset there.
        self.boundary_masks = backend is not None and '"trim_offsets":true' not in _compact_json(backend.post_processor)
        self._special = {
            "bos_token": tokenizer.bos_token or "",
            "eos_token": tokenizer.eos_token or "",
            "pad_token": tokenizer.pad_token or "",
        }

    def render(
        self, messages: list[dict], tools: list | None = None, add_generation_prompt: bool = False
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the character spans the assistant produces."""
        if self.loss_on == "all" or add_generation_prompt:
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=self.template.text,
                add_generation_prompt=add_generation_prompt,
                **self._special,
            )
            text = rendered[0]
            if self.loss_on != "all":
                return text, []
            return text, self._thinking_cut(text, [(0, len(text))])
        rendered, indices = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=self.template.training,
            return_assistant_tokens_mask=True,
            **self._special,
        )
        text = rendered[0]
        spans = [self._end_at_eos(text, start, end) for start, end in indices[0] if end > start]
        if self.loss_on == "final_assistant":
            spans = spans[-1:]
        return text, self._thinking_cut(text, spans)

    def _thinking_cut(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return without_thinking(text, spans) if not self.loss_on_thinking and THINK_OPEN in text else spans

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
            conversations=[messages],
            tools=tools,
            chat_template=self.template.text,
            add_generation_prompt=True,
            **self._special,
        )
        return rendered[0]

    def tokenize(self, messages: list[dict], tools: list | None = None, *, truncate: bool = True) -> TokenizedRow:
        text, spans = self.render(messages, tools)
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(encoding["input_ids"], dtype=np.int64)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        trained = _overlaps(offsets, spans)
        truncated_at, lost = None, 0
        if truncate and self.max_length is not None and len(ids) > self.max_length:
            keep = (
                slice(None, self.max_length) if self.truncation_mode == "keep_start" else slice(-self.max_length, None)
            )
            lost = int(trained.sum() - trained[keep].sum())
            cut = self.max_length if self.truncation_mode == "keep_start" else len(ids) - self.max_length
            truncated_at = int(offsets[cut][0])
            ids, offsets, trained = ids[keep], offsets[keep], trained[keep]
        return TokenizedRow(
            text=text,
            input_ids=ids.tolist(),
            labels=np.where(trained, ids, IGNORE_INDEX).tolist(),
            trained_spans=_merge(offsets[trained]),
            truncated_at=truncated_at,
            trained_tokens_lost=lost,
        )


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def thinking_spans(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """The `<think>...</think>` blocks of text[start:end] (the tags included; an unclosed one runs to `end`)."""
    import re

    end = len(text) if end is None else end
    return [(m.start(), m.end()) for m in re.compile(r"<think>.*?(?:</think>|$)", re.S).finditer(text[:end], start)]


def without_thinking(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The trained spans with the reasoning blocks inside them cut out (the answer after `</think>` stays trained;
    a `<think>` the user wrote in a prompt is not reasoning). The whitespace a template puts between `</think>` and
    the answer goes with the reasoning."""
    kept = []
    for start, end in spans:
        pieces, position = [], start
        for cut_start, cut_end in thinking_spans(text, start, end):
            while cut_end < end and text[cut_end] in " \n":
                cut_end += 1
            if cut_start > position:
                pieces.append((position, cut_start))
            position = cut_end
        if end > position:
            pieces.append((position, end))
        kept += pieces
    return kept


def split_thinking(text):
    """(the answer, the reasoning) of a generated text: a reasoning model's `<think>...</think>` block at the start
    of its answer is taken out (an unclosed one - generation stopped while reasoning - leaves no answer); reasoning
    None without one. A `<think>` further in is the answer's own text. Anything but text passes through."""
    if not isinstance(text, str) or not text.lstrip().startswith("<think>"):
        return text, None
    body = text.lstrip()[len("<think>") :]
    reasoning, closed, answer = body.partition("</think>")
    return (answer.strip() if closed else ""), reasoning.strip()


@dataclass
class CompactRow:
    """What training keeps of an SFT row (data/table.py stores these as Arrow): no text, no spans."""

    input_ids: np.ndarray  # int32, after truncation
    labels: np.ndarray  # int32, IGNORE_INDEX where no loss
    trained_tokens_lost: int
    truncated: bool

    @property
    def tokens(self) -> int:
        return len(self.input_ids)

    @property
    def trained_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    def columns(self) -> dict:
        return {"input_ids": self.input_ids, "labels": self.labels}


def tokenize_many(renderer: Renderer, conversations: list) -> list[CompactRow]:
    """`Renderer.tokenize` for a batch of conversations, with the same ids and labels, ~2x faster.

    One `encode_batch` call for the batch, and the loss mask found from the few span boundaries
    (`char_to_token`) instead of every token's offsets: building the offsets as Python tuples took as
    long as tokenizing (bench/NOTES.md). Where that shortcut could differ from the per-token definition
    (offsets trimmed by the post-processor, or the first row of the batch disagreeing with the exact
    mask), the batch uses every token's offsets."""
    rendered = [renderer.render(c.messages, c.tools) for c in conversations]
    backend = renderer.backend
    if backend is None:  # a slow (Python) tokenizer: one row at a time
        return [_compact(renderer.tokenize(c.messages, c.tools)) for c in conversations]
    encodings = backend.encode_batch([text for text, _ in rendered], add_special_tokens=False)
    fast = renderer.boundary_masks
    rows = []
    for index, ((_text, spans), encoding) in enumerate(zip(rendered, encodings, strict=True)):
        ids = np.asarray(encoding.ids, dtype=np.int32)
        trained = _boundary_mask(encoding, spans, len(ids)) if fast else None
        if trained is not None and index == 0:  # the check that the shortcut holds for this tokenizer
            exact = _overlaps(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), spans)
            if not np.array_equal(trained, exact):
                fast, trained = False, exact
        if trained is None:
            trained = _overlaps(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), spans)
        lost, truncated = 0, False
        if renderer.max_length is not None and len(ids) > renderer.max_length:
            keep = (
                slice(None, renderer.max_length)
                if renderer.truncation_mode == "keep_start"
                else slice(-renderer.max_length, None)
            )
            lost = int(trained.sum() - trained[keep].sum())
            ids, trained, truncated = ids[keep], trained[keep], True
        rows.append(CompactRow(ids, np.where(trained, ids, IGNORE_INDEX).astype(np.int32), lost, truncated))
    return rows


def _compact(row: TokenizedRow) -> CompactRow:
    return CompactRow(
        np.asarray(row.input_ids, dtype=np.int32),
        np.asarray(row.labels, dtype=np.int32),
        row.trained_tokens_lost,
        row.truncated_at is not None,
    )


def _boundary_mask(encoding, spans: list[tuple[int, int]], count: int) -> np.ndarray | None:
    """The tokens overlapping the spans, from the tokens at the spans' first and last characters (and
    their neighbours that share those characters: a character split over several byte-level tokens).
    None when a boundary character belongs to no token (the caller then uses every offset)."""
    trained = np.zeros(count, dtype=bool)
    if not spans or count == 0:
        return trained
    for start, end in _merge(np.asarray(sorted(spans), dtype=np.int64)):
        if end <= start:
            continue
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1)
        if first is None or last is None:
            return None
        while first > 0 and encoding.token_to_chars(first - 1)[1] > start:
            first -= 1
        while last + 1 < count and encoding.token_to_chars(last + 1)[0] < end:
            last += 1
        trained[first : last + 1] = True
    return trained


def split_completion(
    renderer: Renderer, prompt: list[dict], completion: list[dict], tools: list | None, prompt_text: str | None = None
) -> TokenizedCompletion:
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
    completion_text = full_text[len(prompt_text) :]
    eos = renderer._special["eos_token"]
    if eos and completion_text.endswith(eos + "\n"):  # the turn separator is never generated (see _end_at_eos)
        completion_text = completion_text[:-1]
    encoding = renderer.tokenizer(prompt_text + completion_text, add_special_tokens=False, return_offsets_mapping=True)
    boundary = len(prompt_text)
    # A token that straddles the boundary goes to the completion, so no completion text goes untrained.
    cut = next(
        (i for i, (_, end) in enumerate(encoding["offset_mapping"]) if end > boundary), len(encoding["input_ids"])
    )
    ids = list(encoding["input_ids"])
    return TokenizedCompletion(prompt_text, completion_text, ids[:cut], ids[cut:])


def _compact_json(part) -> str:
    if part is None:
        return ""
    try:
        return part.__getstate__().decode().replace(" ", "")
    except Exception:  # noqa: BLE001 - an unknown component: assume the worst
        return '"trim_offsets":true'


# Token-by-span work in NumPy over the tokenizer's offsets: done per token in Python it was ~40% of `validate`
# on real-size data (bench/NOTES.md).
def _overlaps(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Per token (start, end): does it overlap a trained character span? (Empty tokens never do.)"""
    if not spans or len(offsets) == 0:
        return np.zeros(len(offsets), dtype=bool)
    union = _merge(np.asarray(sorted(spans), dtype=np.int64))  # sorted, disjoint: ends increase too
    span_starts = np.asarray([a for a, _ in union], dtype=np.int64)
    span_ends = np.asarray([b for _, b in union], dtype=np.int64)
    starts, ends = offsets[:, 0], offsets[:, 1]
    first = np.searchsorted(span_ends, starts, side="right")  # the first span ending after the token starts
    inside = first < len(span_ends)
    overlaps = np.zeros(len(offsets), dtype=bool)
    overlaps[inside] = span_starts[first[inside]] < ends[inside]
    return overlaps & (ends > starts)


def _merge(offsets) -> list[tuple[int, int]]:
    """Consecutive (start, end) pairs, in order of start, joined where they touch or overlap."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if len(offsets) == 0:
        return []
    reach = np.maximum.accumulate(offsets[:, 1])
    new = np.ones(len(offsets), dtype=bool)
    new[1:] = offsets[1:, 0] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(offsets) - 1)
    return [(int(a), int(b)) for a, b in zip(offsets[first, 0], reach[last], strict=True)]
