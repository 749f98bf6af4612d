"""One home for what each training type is (issue #26, first step): its name as the config writes it, its family,
the profile it starts from, and what a run of it produces, in the words the messages use.

Modules ask here ("is this a retrieval type?", "what does a colbert run train?") instead of spelling tuples of
type names of their own: a new type (image SFT is next) is added once, here, and every question answered about it
at once. Ground floor: imports nothing of the package, so config, data, models and launch can all ask.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str  # training_type as written in the config
    family: str  # generation (sft), preference (dpo, kto), reinforcement (grpo), retrieval (embedding, colbert)
    profile: str  # the training_config profile a starter config extends
    trains: str  # what the run produces, as messages say it


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("sft", "generation", "DEFAULT_SFT", "a language model (chat)"),
    Method("dpo", "preference", "DEFAULT_DPO", "a language model (chat) tuned on preference pairs"),
    Method("kto", "preference", "DEFAULT_KTO", "a language model (chat) tuned on desirable/undesirable answers"),
    Method("grpo", "reinforcement", "DEFAULT_GRPO", "a language model (chat) tuned on rewards"),
    Method("embedding", "retrieval", "DEFAULT_EMBEDDING", "an embedding model (one vector per text)"),
    Method("colbert", "retrieval", "DEFAULT_COLBERT", "a ColBERT model (one vector per token)"),
)}

TRAINING_TYPES: tuple[str, ...] = tuple(METHODS)
RETRIEVAL_TYPES: tuple[str, ...] = tuple(name for name, m in METHODS.items() if m.family == "retrieval")


def is_retrieval(training_type: str | None) -> bool:
    """Embedding or ColBERT training: (query, document) pairs, a sentence-transformers model, retrieval metrics."""
    return training_type in RETRIEVAL_TYPES
