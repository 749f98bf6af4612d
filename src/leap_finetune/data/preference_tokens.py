"""Tokenized preference rows: what the DPO and KTO trainers read, and what `inspect` shows."""

from __future__ import annotations

from dataclasses import dataclass, field

from leap_finetune.data.preference_rows import KtoRow, PreferenceRow
from leap_finetune.data.render import Renderer, split_completion


@dataclass
class TokenizedPair:
    prompt_text: str
    chosen_text: str
    rejected_text: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    max_length: int | None
    meta: dict = field(default_factory=dict)
    implicit_prompt: bool = False
    images: list[str] | None = None  # an image run: the prompt's image sources (prompt_ids hold their tokens)
    image_tokens: list[int] | None = None

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids) * 2 + len(self.chosen_ids) + len(self.rejected_ids)

    @property
    def trained_tokens(self) -> int:
        """Completion tokens that survive truncation of prompt + completion to max_length."""
        return _kept(self.prompt_ids, self.chosen_ids, self.max_length) + _kept(
            self.prompt_ids, self.rejected_ids, self.max_length
        )

    @property
    def truncated(self) -> bool:
        return self.trained_tokens < len(self.chosen_ids) + len(self.rejected_ids)

    def columns(self) -> dict:
        columns = {"prompt_ids": self.prompt_ids, "chosen_ids": self.chosen_ids, "rejected_ids": self.rejected_ids}
        if self.images is not None:
            columns.update(image_sources=self.images, image_tokens=self.image_tokens)
        return columns

    def inspect(self) -> dict:
        item = {
            "prompt": self.prompt_text,
            "chosen": self.chosen_text,
            "rejected": self.rejected_text,
            "prompt_tokens": len(self.prompt_ids),
            "chosen_tokens": len(self.chosen_ids),
            "rejected_tokens": len(self.rejected_ids),
        }
        if self.implicit_prompt:
            item["implicit_prompt"] = True
        return item


@dataclass
class TokenizedKto:
    prompt_text: str
    completion_text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    label: bool
    max_length: int | None
    meta: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def trained_tokens(self) -> int:
        return _kept(self.prompt_ids, self.completion_ids, self.max_length)

    @property
    def truncated(self) -> bool:
        return self.trained_tokens < len(self.completion_ids)

    def columns(self) -> dict:
        return {"prompt_ids": self.prompt_ids, "completion_ids": self.completion_ids, "label": self.label}

    def inspect(self) -> dict:
        return {
            "prompt": self.prompt_text,
            "completion": self.completion_text,
            "label": self.label,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.completion_ids),
        }


def _kept(prompt: list[int], completion: list[int], max_length: int | None) -> int:
    """TRL's collators truncate prompt + completion to max_length from the end (keep_start)."""
    if max_length is None:
        return len(completion)
    return max(0, min(len(completion), max_length - len(prompt)))


def tokenize_pair(renderer: Renderer, row: PreferenceRow) -> TokenizedPair:
    chosen = split_completion(renderer, row.prompt, row.chosen, row.tools)
    rejected = split_completion(renderer, row.prompt, row.rejected, row.tools)
    return TokenizedPair(
        chosen.prompt_text,
        chosen.completion_text,
        rejected.completion_text,
        chosen.prompt_ids,
        chosen.completion_ids,
        rejected.completion_ids,
        renderer.max_length,
        implicit_prompt=row.implicit_prompt,
        images=[ref.source for ref in row.images] if getattr(row, "images", None) else None,
    )


def tokenize_kto(renderer: Renderer, row: KtoRow) -> TokenizedKto:
    part = split_completion(renderer, row.prompt, row.completion, row.tools)
    return TokenizedKto(
        part.prompt_text, part.completion_text, part.prompt_ids, part.completion_ids, row.label, renderer.max_length
    )


def kto_balance_advice(labels: list[bool], desirable_weight: float, undesirable_weight: float) -> str | None:
    """A warning when desirable and undesirable rows are out of balance for the current weights.

    The KTO paper (Eq. 8, https://huggingface.co/papers/2402.01306) recommends
    desirable_weight * n_desirable / (undesirable_weight * n_undesirable) in [1, 4/3]; TRL uses the
    same bounds. We say it before training, with the values to set."""
    desirable = sum(labels)
    undesirable = len(labels) - desirable
    if not desirable or not undesirable:
        side = "undesirable (label false)" if not undesirable else "desirable (label true)"
        return f"KTO data has no {side} rows: KTO learns from both kinds; add some"
    ratio = desirable * desirable_weight / (undesirable * undesirable_weight)
    if 1 <= ratio <= 4 / 3:
        return None
    des_low, des_high = (
        undesirable * undesirable_weight / desirable,
        undesirable * undesirable_weight / desirable * 4 / 3,
    )
    und_low, und_high = desirable * desirable_weight / undesirable * 3 / 4, desirable * desirable_weight / undesirable
    return (
        f"KTO data: {desirable} desirable vs {undesirable} undesirable rows, out of balance for "
        f"desirable_weight={desirable_weight}, undesirable_weight={undesirable_weight}; set EITHER "
        f"desirable_weight in [{des_low:.2f}, {des_high:.2f}] OR undesirable_weight in [{und_low:.2f}, {und_high:.2f}] "
        "in training_config"
    )
