"""Canaries for what we do in TRL's place. Each builds TRL's own trainer on the same rows and compares
its prepared dataset with ours, so a TRL upgrade that changes preparation fails here, not silently in
a user's run.

- SFT: our rows go in with TRL's documented `dataset_kwargs: {skip_prepare_dataset: true}`, and
  recipes/sft.py `for_trainer` shuffles and packs them as TRL would.
- DPO and KTO: our `_prepare_dataset` overrides (TRL has no "already tokenized" switch there) keep
  our token ids; TRL's own tokenization of the same conversations must give the same ids, except that
  TRL also trains the newline after `<|im_end|>` (a token the model never generates: we leave it out,
  data/render.py `split_completion`), and KTO's KL pairing must be TRL's rotation.
"""

from __future__ import annotations

import pytest
from datasets import Dataset

from leap_finetune.api import validate_config
from leap_finetune.data.chat_templates import official_template
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer
from leap_finetune.recipes.kto import kl_completions
from tests.conftest import fact_rows, tiny_config, write_jsonl

WORDS = ["red", "blue", "teal", "gold", "pink", "gray", "navy", "lime"]


@pytest.fixture
def tokenizer():
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    tokenizer.chat_template = official_template("lfm2")
    return tokenizer


def _quiet():
    from leap_finetune.recipes.common import quiet_libraries

    quiet_libraries()


@pytest.mark.parametrize("packing", [False, True])
def test_sft_skip_prepare_equals_trls_own_preparation(tmp_path, tokenizer, packing):
    from trl import SFTConfig, SFTTrainer

    from leap_finetune.recipes.sft import for_trainer

    _quiet()
    write_jsonl(tmp_path / "train.jsonl", fact_rows(24))
    prepared = validate_config(tiny_config(data=str(tmp_path / "train.jsonl")))
    dataset = prepared.train.dataset()
    common = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_length=64,
        packing=packing,
        shuffle_dataset=True,
        seed=3,
        per_device_train_batch_size=2,
    )
    ours_args = SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True})
    ours = SFTTrainer(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        args=ours_args,
        processing_class=tokenizer,
        train_dataset=for_trainer(dataset, ours_args, packing),
    )
    trls = SFTTrainer(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        args=SFTConfig(**common),
        processing_class=tokenizer,
        train_dataset=dataset,
    )
    columns = ["input_ids", "labels"] + (["seq_lengths"] if packing else [])
    assert set(columns) <= set(trls.train_dataset.column_names)
    assert ours.train_dataset.select_columns(columns).to_list() == trls.train_dataset.select_columns(columns).to_list()
    batch = next(iter(ours.get_train_dataloader()))
    reference = next(iter(trls.get_train_dataloader()))
    assert batch.keys() == reference.keys()
    for key in batch:
        value, expected = batch[key], reference[key]
        assert (value.tolist() if hasattr(value, "tolist") else value) == (
            expected.tolist() if hasattr(expected, "tolist") else expected
        ), key


def _pairs(n: int) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"Say {WORDS[i % 8]} twice."}],
            "chosen": [{"role": "assistant", "content": f"{WORDS[i % 8]} {WORDS[i % 8]}"}],
            "rejected": [{"role": "assistant", "content": "I refuse."}],
        }
        for i in range(n)
    ]


def test_dpo_token_ids_equal_trls_own_tokenization(tmp_path, tokenizer):
    from trl import DPOConfig, DPOTrainer

    from leap_finetune.recipes.dpo import trainer_class

    _quiet()
    rows = _pairs(6)
    write_jsonl(tmp_path / "dpo.jsonl", rows)
    prepared = validate_config(
        tiny_config(training_type="dpo", data=str(tmp_path / "dpo.jsonl"), training_config={"extends": "DEFAULT_DPO"})
    )
    args = DPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_length=128,
        per_device_train_batch_size=2,
    )
    trls = DPOTrainer(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        ref_model=build_tiny_model("tiny-lfm2", tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
    )
    ours = trainer_class()(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        ref_model=build_tiny_model("tiny-lfm2", tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=prepared.train.dataset(),
    )
    newline = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("\n"))
    for mine, theirs in zip(ours.train_dataset.to_list(), trls.train_dataset.to_list(), strict=True):
        assert mine["prompt_ids"] == theirs["prompt_ids"]
        assert mine["chosen_ids"] + newline == theirs["chosen_ids"]
        assert mine["rejected_ids"] + newline == theirs["rejected_ids"]
    # TRL's collator takes our rows as they are
    batch = next(iter(ours.get_train_dataloader()))
    assert {"input_ids", "attention_mask", "completion_mask"} <= set(batch)


def test_kto_token_ids_and_kl_pairs_equal_trls_own(tmp_path, tokenizer):
    from trl import KTOConfig, KTOTrainer

    from leap_finetune.recipes.kto import trainer_class

    _quiet()
    rows = [
        {"prompt": p["prompt"], "completion": p["chosen"] if i % 2 else p["rejected"], "label": bool(i % 2)}
        for i, p in enumerate(_pairs(8))
    ]
    write_jsonl(tmp_path / "kto.jsonl", rows)
    prepared = validate_config(
        tiny_config(
            training_type="kto",
            data=str(tmp_path / "kto.jsonl"),
            training_config={"extends": "DEFAULT_KTO", "per_device_train_batch_size": 4},
        )
    )
    args = KTOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_length=128,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
    )
    trls = KTOTrainer(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        ref_model=build_tiny_model("tiny-lfm2", tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
    )
    ours = trainer_class()(
        model=build_tiny_model("tiny-lfm2", tokenizer),
        ref_model=build_tiny_model("tiny-lfm2", tokenizer),
        args=args,
        processing_class=tokenizer,
        train_dataset=prepared.train.dataset(),
    )
    newline = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("\n"))
    assert set(ours.train_dataset.column_names) <= set(trls.train_dataset.column_names)
    for mine, theirs in zip(ours.train_dataset.to_list(), trls.train_dataset.to_list(), strict=True):
        assert mine["prompt_ids"] == theirs["prompt_ids"] and mine["label"] == theirs["label"]
        assert mine["completion_ids"] + newline == theirs["completion_ids"]
        assert mine["KL_completion_ids"] + newline == theirs["KL_completion_ids"]


def test_kl_pairs_never_pair_a_row_with_itself():
    rows = list(range(9))
    assert kl_completions(rows, 4) == [3, 0, 1, 2, 7, 4, 5, 6, 7]  # TRL's rotation, then the lone last row
    assert kl_completions(rows[:8], 4) == [3, 0, 1, 2, 7, 4, 5, 6]
    for n in range(2, 20):
        for size in range(2, 6):
            pairs = kl_completions(list(range(n)), size)
            assert all(pair != row for row, pair in enumerate(pairs)), (n, size)
