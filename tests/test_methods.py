"""methods/: the one list of training types. Each has its profile, its recipe and its row contract; the other
modules' questions ("retrieval?", "what does it train?") are answered from it, so a type added there is known
everywhere (issue #26)."""

from __future__ import annotations

import importlib.util

from leap_finetune.config import profiles
from leap_finetune.config.schema import TRAINING_TYPES
from leap_finetune.methods import METHODS, RETRIEVAL_TYPES, is_retrieval


def test_every_type_has_its_profile_and_its_recipe():
    assert TRAINING_TYPES == tuple(METHODS) == ("sft", "dpo", "kto", "grpo", "embedding", "colbert")
    for name, method in METHODS.items():
        assert method.profile in profiles.TRAINING_PROFILES, name
        assert importlib.util.find_spec(f"leap_finetune.recipes.{name}") is not None, name


def test_retrieval_is_asked_of_methods():
    from leap_finetune.data import chunks
    from leap_finetune.models import trained

    assert RETRIEVAL_TYPES == ("embedding", "colbert")
    assert [is_retrieval(t) for t in TRAINING_TYPES] == [False, False, False, False, True, True]
    assert not is_retrieval(None)
    # the data contract and the trained-model messages use the same list, not spellings of their own
    assert chunks.RETRIEVAL == RETRIEVAL_TYPES
    assert trained.RETRIEVAL == {"embedding": "an embedding model (one vector per text)",
                                 "colbert": "a ColBERT model (one vector per token)"}


def test_no_module_spells_the_retrieval_types_itself():
    """The tuple lives in methods/ only: a copy elsewhere would miss the next retrieval type."""
    from pathlib import Path

    import leap_finetune

    root = Path(leap_finetune.__file__).parent
    spelled = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.parent.name != "methods" and any(s in p.read_text(encoding="utf-8") for s in (
                   '("embedding", "colbert")', "('embedding', 'colbert')", '"embedding", "colbert", '))]
    assert spelled == [], spelled
