"""methods/: the one list of training types. Each has its profile, its recipe and its row contract; the other
modules' questions ("retrieval?", "what does it train?") are answered from it, so a type added there is known
everywhere (issue #26)."""

from __future__ import annotations

import importlib.util

import pytest

from leap_finetune.config import profiles
from leap_finetune.methods import METHODS, RETRIEVAL_TYPES, TRAINING_TYPES, is_retrieval


def test_every_type_has_its_profile_and_its_recipe():
    assert TRAINING_TYPES == tuple(METHODS) == ("sft", "distill", "dpo", "kto", "grpo", "embedding", "colbert")
    for name, method in METHODS.items():
        assert method.profile in profiles.TRAINING_PROFILES, name
        assert importlib.util.find_spec(f"leap_finetune.recipes.{name}") is not None, name


def test_retrieval_is_asked_of_methods():
    from leap_finetune.methods import method_of, trained_by

    assert RETRIEVAL_TYPES == ("embedding", "colbert")
    assert [is_retrieval(t) for t in TRAINING_TYPES] == [False, False, False, False, False, True, True]
    assert not is_retrieval(None)
    assert [method_of(t).multi_vector for t in RETRIEVAL_TYPES] == [False, True]
    # a sentence-transformers folder's class names its training type (an unknown class: an embedding model)
    assert [trained_by(c) for c in ("SentenceTransformer", "MultiVectorEncoder", "SparseEncoder")] == [
        "embedding",
        "colbert",
        "embedding",
    ]


def test_no_module_spells_the_retrieval_types_itself():
    """The tuple lives in methods/ only: a copy elsewhere would miss the next retrieval type."""
    from pathlib import Path

    import leap_finetune

    root = Path(leap_finetune.__file__).parent
    spelled = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.parent.name != "methods"
        and any(
            s in p.read_text(encoding="utf-8")
            for s in ('("embedding", "colbert")', "('embedding', 'colbert')", '"embedding", "colbert", ')
        )
    ]
    assert spelled == [], spelled


@pytest.mark.parametrize("training_type", TRAINING_TYPES)
def test_every_type_through_every_config_rule(training_type):
    """Each rule of config/rules.py asked about each type (a new type in methods/ is walked through all of them):
    its starting profile passes every rule; every metric its evaluation logs may be metric_for_best_model, and
    an unknown one is refused with a fix whose every suggestion is itself accepted (not an empty "use one of:");
    the sampling strategies are accepted or refused before the model loads, as TRL would."""
    import re

    from leap_finetune.config.rules import check_best_model_metric, check_sampling, check_training_rules
    from leap_finetune.errors import LeapError
    from leap_finetune.methods import method_of

    m = method_of(training_type)
    rewards, benchmarks = ("accuracy",) if m.rewards else (), ("bench",) if m.retrieval else ()
    profile = profiles.training_profile(m.profile)
    check_training_rules(training_type, profile, "c.yaml", rewards=rewards, benchmarks=benchmarks)

    for name in m.eval_metrics:
        check_best_model_metric(training_type, {"metric_for_best_model": f"eval_{name}"}, "c.yaml")
    with pytest.raises(LeapError) as refused:
        check_best_model_metric(
            training_type, {"metric_for_best_model": "eval_nonsense"}, "c.yaml", rewards=rewards, benchmarks=benchmarks
        )
    suggested = re.findall(r"eval_[\w/@.]+", refused.value.fix)
    assert len(suggested) >= 2 and "use one of: ," not in refused.value.fix, refused.value.fix
    for name in suggested:
        check_best_model_metric(
            training_type, {"metric_for_best_model": name}, "c.yaml", rewards=rewards, benchmarks=benchmarks
        )

    for strategy in ("random", "sequential", "group_by_length", "batch_rebalance"):
        allowed = strategy == "sequential" or (strategy == "random" and not m.kl_pairs) or m.length_samplers
        if allowed:
            check_sampling(training_type, {"train_sampling_strategy": strategy}, "c.yaml")
        else:
            with pytest.raises(LeapError, match=f"train_sampling_strategy: {strategy}"):
                check_sampling(training_type, {"train_sampling_strategy": strategy}, "c.yaml")


@pytest.mark.parametrize("training_type", TRAINING_TYPES)
def test_every_type_has_a_row_checker_and_a_tokenizer(training_type):
    """The data step finds each type's row contract from its row kind (a kind without one fails here, not in a
    user's run)."""
    from types import SimpleNamespace

    from leap_finetune.data.row_kinds import ROW_SHAPES, contract
    from leap_finetune.methods import method_of

    resolved = SimpleNamespace(
        training_type=training_type, chat_template="lfm2", model_family="lfm2", loss_on="assistant", vision=False
    )
    assert callable(contract(resolved))
    assert method_of(training_type).rows in {rows for rows, _ in ROW_SHAPES}


def test_the_optimizer_validate_does_not_ask_about_is_one_that_builds(tmp_path):
    """`validate` asks transformers' Trainer for the optimizer only when training_config chooses one
    (config/rules.py OPTIMIZER_KEYS): no profile chooses one, and each type's default builds."""
    from transformers import Trainer

    from leap_finetune.config.rules import OPTIMIZER_KEYS

    for method in METHODS.values():
        assert not set(OPTIMIZER_KEYS) & set(profiles.training_profile(method.profile)), method.profile
        args = method.arguments_class()(output_dir=str(tmp_path), use_cpu=True)
        optimizer_cls, _ = Trainer.get_optimizer_cls_and_kwargs(args)
        assert optimizer_cls.__name__ == "AdamW", (method.name, optimizer_cls)


def test_every_types_recipe_module_implements_the_recipe_protocol():
    """launch/ asks the module a type's Method names (`recipe_module`) for `config_class()`,
    `training_arguments(resolved, run_dir=, has_eval=, cuda=)` and `train(resolved_json, callbacks=)`: every
    registered type's module offers each with the parameters of recipes.Recipe (names, kinds, defaults,
    annotations), and its config class is the one its Method names."""
    import inspect

    from leap_finetune.recipes import Recipe, recipe

    def parameters(function, *, drop_self: bool = False) -> list[tuple]:
        found = list(inspect.signature(function).parameters.values())[1 if drop_self else 0 :]
        return [(p.name, p.kind, p.default, p.annotation) for p in found]

    for name, method in METHODS.items():
        module = recipe(name)
        assert module.__name__ == method.recipe_module, name
        for function in ("config_class", "training_arguments", "train"):
            assert callable(getattr(module, function, None)), f"{module.__name__} has no {function}"
            assert parameters(getattr(module, function)) == parameters(getattr(Recipe, function), drop_self=True), (
                f"{module.__name__}.{function}{inspect.signature(getattr(module, function))} is not "
                f"Recipe.{function}{inspect.signature(getattr(Recipe, function))}"
            )
        assert module.config_class() is method.arguments_class(), name
