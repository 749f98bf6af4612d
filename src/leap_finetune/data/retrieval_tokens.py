"""Retrieval rows as the encoder sees them: prompts put before queries and documents, each text cut to its
side's token limit (at a token boundary of the original text, so nothing is re-spelled), and counted.

sentence-transformers tokenizes again while training (with one limit for both sides); texts cut here
already fit, so what `inspect` shows and the data report counts is what the model reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leap_finetune.data.retrieval_rows import RetrievalRow


@dataclass
class RetrievalExample:
    query: str  # without the prompt (sentence-transformers adds it, and keeps it in the saved model)
    positive: str
    negatives: list[str]
    tokens: int  # query + positive + negatives, prompts and special tokens included
    truncated: bool
    negatives_used: int | None = None  # set by the data step: the same number of negative columns in every row
    meta: dict = field(default_factory=dict)
    prompts: tuple[str, str] = ("", "")  # (query, document): shown by inspect as the model reads the texts

    @property
    def trained_tokens(self) -> int:
        return self.tokens

    def columns(self) -> dict:
        used = self.negatives if self.negatives_used is None else self.negatives[: self.negatives_used]
        return {
            "query": self.query,
            "positive": self.positive,
            **{f"negative_{i + 1}": text for i, text in enumerate(used)},
        }

    def inspect(self) -> dict:
        """The texts as the encoder reads them (prompts included, cut to their side's limit)."""
        query_prompt, document_prompt = self.prompts
        used = self.negatives if self.negatives_used is None else self.negatives[: self.negatives_used]
        return {
            "query": query_prompt + self.query,
            "positive": document_prompt + self.positive,
            "negatives": [document_prompt + text for text in used],
            "unused_negatives": len(self.negatives) - len(used),
            "truncated": self.truncated,
        }


class RetrievalEncoder:
    """What the data step needs of the model's tokenizer for retrieval rows."""

    def __init__(self, tokenizer, prompts, query_max_length: int | None, document_max_length: int | None):
        self.tokenizer = tokenizer
        self.query_prompt = prompts.query or ""
        self.document_prompt = prompts.document or ""
        model_max = getattr(tokenizer, "model_max_length", None)
        model_max = model_max if isinstance(model_max, int) and model_max < 1_000_000 else None
        self.query_max = query_max_length or model_max
        self.document_max = document_max_length or model_max
        self.max_length = max(x for x in (self.query_max, self.document_max, 0) if x is not None) or None

    def _fit(self, prompt: str, text: str, limit: int | None) -> tuple[str, int, bool]:
        """(the text, cut to fit `limit` tokens with its prompt and special tokens; its token count; cut?)"""
        specials = self.tokenizer.num_special_tokens_to_add()
        prompt_tokens = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoded["input_ids"]
        total = specials + prompt_tokens + len(ids)
        if limit is None or total <= limit:
            return text, total, False
        keep = max(0, limit - specials - prompt_tokens)
        cut = encoded["offset_mapping"][keep][0] if keep < len(ids) else len(text)
        return text[:cut].rstrip(), limit, True

    def encode(self, row: RetrievalRow) -> RetrievalExample:
        query, total, cut = self._fit(self.query_prompt, row.query, self.query_max)
        positive, count, cut_positive = self._fit(self.document_prompt, row.positive, self.document_max)
        total += count
        negatives = []
        cut_negative = False
        for text in row.negatives:
            fitted, count, was_cut = self._fit(self.document_prompt, text, self.document_max)
            negatives.append(fitted)
            total += count
            cut_negative |= was_cut
        return RetrievalExample(
            query,
            positive,
            negatives,
            total,
            cut or cut_positive or cut_negative,
            prompts=(self.query_prompt, self.document_prompt),
        )
