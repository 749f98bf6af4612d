"""leap-finetune's own training_config keys (config/own_keys.py): declared once, for the types that take them, and
read by validate, by the trainer's arguments and by the reference docs from that one declaration."""

from __future__ import annotations

import pytest

from leap_finetune.config import own_keys
from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS, TRAINING_TYPES, VISION_KEYS
from leap_finetune.validate.loader import load_config


def test_every_key_a_type_lists_is_declared_and_every_declared_key_belongs_to_a_type():
    declared = set(own_keys.KEYS)
    listed = {key for method in METHODS.values() for key in method.own_keys}
    vision = set(VISION_KEYS) if any(method.images for method in METHODS.values()) else set()
    assert listed | vision <= declared, "declare it in config/own_keys.py (its type and what it means)"
    assert declared <= listed | vision | set(own_keys.EVERY_TYPE), "a declared key no training type takes"


def test_every_declared_key_says_what_it_takes_and_means():
    for key, field in own_keys.KEYS.items():
        assert own_keys.values_text(key) and field.description, key


def test_the_trainer_is_given_none_of_the_keys_its_type_takes_and_every_other_key():
    training = dict.fromkeys(own_keys.KEYS, "value") | {"learning_rate": 1e-4, "model_init_kwargs": {"dtype": "auto"}}
    for name, method in METHODS.items():
        args = own_keys.trainer_arguments(training, method)
        assert not set(args) & set(own_keys.keys_of(method)), name
        assert args["learning_rate"] == 1e-4 and "model_init_kwargs" not in args
        # (padding_free is TRL's own key for sft and dpo: theirs to receive; leap-finetune's for the others)
        assert ("padding_free" in args) == ("padding_free" not in method.own_keys), name


def _switches(training_type: str) -> list[str]:
    return [k for k in own_keys.keys_of(METHODS[training_type]) if own_keys.is_switch(k) and k not in VISION_KEYS]


# (the types that take a true/false key of leap-finetune's: grpo takes none)
@pytest.mark.parametrize("training_type", [t for t in TRAINING_TYPES if _switches(t)])
def test_a_switch_key_given_another_value_is_refused_as_its_declared_type_says(training_type, tmp_path):
    switches = _switches(training_type)
    assert switches
    for key in switches:
        config = {"model_name": "tiny-lfm2", "training_type": training_type, "training_config": {key: "yes"}}
        with pytest.raises(LeapError) as info:
            load_config(config, base_dir=tmp_path)
        assert f"training_config.{key} is 'yes'" in str(info.value) and info.value.fix == "use true or false"


def test_a_choice_key_lists_the_declared_choices(tmp_path):
    config = {"model_name": "tiny-lfm2", "training_config": {"loss_on": "every"}}
    with pytest.raises(LeapError) as info:
        load_config(config, base_dir=tmp_path)
    assert info.value.fix.endswith("expected one of: " + ", ".join(own_keys.choices("loss_on")))
    assert own_keys.choices("optimizer_precision") == ("fp32", "bf16_kahan")
    assert own_keys.choices("gradient_communication") == ("fp32", "bf16")
