"""A corpus of broken configs and files, each through the real CLI as `validate` AND as `run`: exit
code 2, one message naming the place (key, file, row), no traceback, and no run folder written.

The CLI runs in-process (`leap_finetune.cli.main`, the console script's entry point) so that the
corpus stays fast; tests/e2e/test_cli.py runs it as a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_finetune.cli import main
from tests.conftest import EXAMPLES, chat, fact_rows, tiny_config, write_config, write_jsonl


def cli(*args: str, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    return info.value.code, capsys.readouterr().err


def _training(**keys) -> dict:
    return {"training_config": keys}


def _lora(**keys) -> dict:
    return {"peft_config": {"extends": "DEFAULT_LORA", **keys}}


def _init(**keys) -> dict:
    return _training(model_init_kwargs=keys)


# name -> (config overrides, texts the message must contain)
CONFIG_CASES = {
    "lr_word": (_training(learning_rate="fast"), ["training_config.learning_rate is 'fast'", "expected a number"]),
    "lr_negative": (_training(learning_rate=-0.1), ["training_config.learning_rate is -0.1", "> 0"]),
    "epochs_word": (_training(num_train_epochs="three"), ["training_config.num_train_epochs is 'three'"]),
    "batch_zero": (_training(per_device_train_batch_size=0), ["per_device_train_batch_size is 0", ">= 1"]),
    "batch_fraction": (
        _training(per_device_train_batch_size=2.5),
        ["per_device_train_batch_size is 2.5", "whole number"],
    ),
    "accumulation_zero": (_training(gradient_accumulation_steps=0), ["gradient_accumulation_steps is 0"]),
    "warmup_word": (_training(warmup_steps="abc"), ["training_config.warmup_steps is 'abc'"]),
    "max_length_zero": (_training(max_length=0), ["training_config.max_length is 0", ">= 1"]),
    "profile_of_another_type": (
        _training(extends="DEFAULT_DPO"),
        ["extends is DEFAULT_DPO", "use extends: DEFAULT_SFT"],
    ),
    "scheduler_typo": (_training(lr_scheduler_type="cosin"), ["lr_scheduler_type is 'cosin'", "did you mean 'cosine'"]),
    "bool_word": (_training(bf16="maybe"), ["training_config.bf16 is 'maybe'", "true, false or null"]),
    "report_to_missing": (
        _training(report_to="wandb"),
        ["report_to names 'wandb'", "not installed", "pip install wandb"],
    ),
    "report_to_unknown": (_training(report_to=["wandbb"]), ["'wandbb'", "did you mean 'wandb'"]),
    "scheduler_needs_kwargs": (
        _training(lr_scheduler_type="cosine_with_min_lr"),
        ["lr_scheduler_type 'cosine_with_min_lr'", "min_lr", "lr_scheduler_kwargs"],
    ),
    "scheduler_bad_kwarg": (_training(lr_scheduler_kwargs={"foo": 1}), ["lr_scheduler_kwargs {'foo': 1}", "'foo'"]),
    "scheduler_kwargs_text": (
        _training(lr_scheduler_kwargs="min_lr=1"),
        ["lr_scheduler_kwargs is 'min_lr=1'", "expected a mapping"],
    ),
    "optimizer_package_missing": (_training(optim="galore_adamw"), ["optim 'galore_adamw'", "galore"]),
    "optimizer_typo": (_training(optim="adamw"), ["optim is 'adamw'", "did you mean 'adamw_torch'"]),
    "push_to_hub_offline": (_training(push_to_hub=True), ["push_to_hub is true", "HF_HUB_OFFLINE"]),
    "fsdp_one_worker": (
        _training(fsdp="full_shard"),
        ["training_config.fsdp shards the model over several workers", "the plan has 1"],
    ),
    "fsdp_cpu_workers": (
        {**_training(fsdp="full_shard"), "ray": {"num_workers": 2}},
        ["fsdp shards the model over GPU workers, but no GPU is visible", "accelerate would ignore it"],
    ),
    "fsdp_with_benchmarks": (
        {
            **_training(fsdp="full_shard"),
            "evals": {"benchmarks": [{"name": "b", "path": "b.jsonl", "metric": "exact_match"}]},
        },
        ["benchmarks during training (evals:) run on rank 0 alone", "leap-finetune eval"],
    ),
    "deepspeed": (_training(deepspeed="ds.json"), ["training_config.deepspeed is not supported", "fsdp"]),
    "gradient_communication_typo": (
        _training(gradient_communication="bf61"),
        ["training_config.gradient_communication is 'bf61'", "did you mean 'bf16'?"],
    ),
    "gradient_communication_number": (_training(gradient_communication=16), ["gradient_communication is 16", "fp32"]),
    "gradient_communication_list": (
        _training(gradient_communication=["bf16"]),
        ["training_config.gradient_communication is ['bf16']", "leave the key out for fp32"],
    ),
    "gradient_communication_true": (_training(gradient_communication=True), ["gradient_communication is true"]),
    "optimizer_precision_list": (
        _training(optimizer_precision=["bf16_kahan"]),
        ["optimizer_precision is ['bf16_kahan']"],
    ),
    "gradient_communication_with_fsdp": (
        {**_training(fsdp="full_shard", gradient_communication="bf16"), "ray": {"num_workers": 2}},
        ["gradient_communication is bf16 and fsdp is set", "remove gradient_communication"],
    ),
    "best_metric_unknown": (
        _training(metric_for_best_model="accuracy"),
        ["metric_for_best_model is 'accuracy'", "eval_loss"],
    ),
    "packing_without_length": (_training(packing=True, max_length=None), ["packing", "max_length is null"]),
    "lora_targets_none": (_lora(target_modules=None), ["target_modules is empty"]),
    "lora_targets_empty": (_lora(target_modules=[]), ["target_modules is empty"]),
    "lora_layers_out_of_range": (_lora(layers_to_transform=[99]), ["layers_to_transform names layer(s) [99]", "0-3"]),
    "lora_use_peft_word": (_lora(use_peft="maybe"), ["use_peft is 'maybe'", "fix: use_peft: true"]),
    "lora_r_zero": (_lora(r=0), ["peft_config.r is 0", ">= 1"]),
    "lora_r_negative": (_lora(r=-4), ["peft_config.r is -4"]),
    "lora_alpha_word": (_lora(lora_alpha="lots"), ["peft_config.lora_alpha is 'lots'"]),
    "lora_dropout": (_lora(lora_dropout=1.7), ["peft_config.lora_dropout is 1.7", "[0, 1)"]),
    "lora_task_type": (_lora(task_type="SEQ_CLS"), ["peft_config.task_type is decided by leap-finetune"]),
    "lora_bias": (_lora(bias="some"), ["peft_config.bias is 'some'", "none, all, lora_only"]),
    "lora_targets": (
        _lora(target_modules=["q_proj", "c_attn"]),
        ["target_modules names 'c_attn'", "not a module of tiny-lfm2", "in_proj"],
    ),
    "lora_target_regex": (_lora(target_modules=r".*\.attn\.c_proj"), ["matches no module of tiny-lfm2"]),
    "init_dtype": (_init(dtype="bfloat61"), ["model_init_kwargs.dtype is 'bfloat61'", "did you mean 'bfloat16'"]),
    "init_device_map": (_init(device_map="auto"), ["model_init_kwargs.device_map is not supported"]),
    "init_unknown": (
        _init(torch_dtyp="bf16"),
        ["'torch_dtyp' is not a from_pretrained argument", "did you mean 'torch_dtype'"],
    ),
    "init_attention_typo": (
        _init(attn_implementation="spda"),
        ["attn_implementation is 'spda'", "did you mean 'sdpa'"],
    ),
    "init_tiny_revision": (_init(revision="v2"), ["model_init_kwargs.revision does not apply to the built-in tiny"]),
    "key_of_other_types": (
        _training(beta=0.1),
        [
            "training_config.beta is a key of dpo, kto and grpo training",
            "not of sft",
            "fix: remove it (sft has no such setting)",
        ],
    ),
    "warmup_ratio_on_sft": (
        _training(warmup_ratio=0.1),
        ["training_config.warmup_ratio is a key of embedding and colbert training, not of sft", "use warmup_steps"],
    ),
    # YAML 1.1 read the text as another type: said, with the quotes that fix it
    "yaml_no_as_text": (
        _training(run_name=False),
        ["training_config.run_name is False", "YAML read what you wrote as the boolean false", "put text in quotes"],
    ),
    "yaml_sexagesimal_time": (
        {"slurm": {"time": 43200}},
        ["slurm.time: expected text (got the number 43200", "12:00:00 is 43200", "put the text in quotes"],
    ),
    "yaml_no_as_a_list_item": (
        {"slurm": {"setup": [False]}},
        ["slurm.setup.0: expected text (got the boolean false", "put the text in quotes, e.g. setup: ['...']"],
    ),
    "yaml_date_as_text": (
        {"slurm": {"job_name": __import__("datetime").date(2026, 1, 1)}},
        ["slurm.job_name: expected text (got a date (2026-01-01))"],
    ),
    # SLURM's formats checked without sbatch (was: written into the script as they were)
    "slurm_time_word": ({"slurm": {"time": "forever"}}, ["slurm.time is 'forever'", "HH:MM:SS", "UNLIMITED"]),
    "slurm_mem_word": ({"slurm": {"mem": "lots"}}, ["slurm.mem is 'lots'", "K, M, G or T", "200G"]),
    "slurm_partition_space": ({"slurm": {"partition": "gpu a100"}}, ["slurm.partition is 'gpu a100'", "commas"]),
    "sidecar_account": (
        {"async_eval": {"mode": "sidecar", "sbatch": {"account": "my lab"}}},
        ["async_eval.sbatch.account is 'my lab'", "an account name"],
    ),
}


@pytest.mark.parametrize("name", CONFIG_CASES)
def test_a_bad_config_value_is_caught_by_validate_and_by_run(name, workdir, capsys):
    overrides, expected = CONFIG_CASES[name]
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    config = tiny_config()
    for block, keys in overrides.items():
        config[block] = {**config.get(block, {}), **keys}
    path = write_config(workdir, config)
    for command in ("validate", "run"):
        code, err = cli(command, str(path), capsys=capsys)
        assert code == 2, (command, err)
        assert err.startswith("error:") and "Traceback" not in err, err
        for text in expected:
            assert text in err, f"{command}: {text!r} not in\n{err}"
    assert not (workdir / "outputs").exists()


def _bad_files(folder: Path) -> dict:
    """name -> (config, texts the message must contain); each writes its broken input into `folder`."""
    cases = {}
    (folder / "object.json").write_text(json.dumps({"data": [chat("q", "a")] * 3}, indent=2))
    cases["json_object"] = (tiny_config(data="object.json"), ["a .json dataset must be an array", "'data'"])

    write_jsonl(folder / "dpo.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}] * 30)
    cases["dpo_rows_as_sft"] = (
        tiny_config(data="dpo.jsonl"),
        ["look like dpo data", "set training_type: dpo", "training_type is sft"],
    )
    cases["length_sampler_for_dpo"] = (
        tiny_config(
            data="dpo.jsonl",
            training_type="dpo",
            training_config={"extends": "DEFAULT_DPO", "train_sampling_strategy": "batch_rebalance"},
        ),
        ["train_sampling_strategy: batch_rebalance works for sft and distill only", "set it to random"],
    )

    write_jsonl(
        folder / "null_user.jsonl",
        [{"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "a"}]}],
    )
    cases["null_user_content"] = (
        tiny_config(data="null_user.jsonl"),
        ["line 1, field 'messages[0].content'", "null: a user message needs content"],
    )

    write_jsonl(folder / "train.jsonl", fact_rows(8))
    (folder / "bench.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    cases["benchmark_row"] = (
        tiny_config(evals={"benchmarks": [{"name": "b", "path": "bench.jsonl", "metric": "exact_match"}]}),
        ["benchmark 'b' row(s)", "no assistant turn", "there is no skipping"],
    )

    (folder / "raises.py").write_text("def score(prediction, reference, row):\n    return 1 / 0\n")
    (folder / "gen.jsonl").write_text(json.dumps(chat("q", "a")) + "\n")
    cases["custom_metric_raises"] = (
        tiny_config(evals={"benchmarks": [{"name": "g", "path": "gen.jsonl", "metric": "./raises.py::score"}]}),
        ["custom metric 'score' raised ZeroDivisionError", "benchmark 'g'", "gen.jsonl, line 1"],
    )

    (folder / "bad.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m.content }{% endgeneration %}{% endfor %}"
    )
    cases["chat_template_syntax"] = (
        tiny_config(chat_template="bad.jinja"),
        ["bad.jinja", "not valid Jinja", "template line 1"],
    )
    cases["home_of_nobody"] = (tiny_config(data="~nobody-here/train.jsonl"), ["cannot expand '~nobody-here'"])
    cases["benchmark_file_missing"] = (
        tiny_config(evals={"benchmarks": [{"name": "b", "path": "nope.jsonl", "metric": "exact_match"}]}),
        ["evals.benchmarks ('b') path", "nope.jsonl", "file not found"],
    )
    cases["val_path_missing"] = (
        tiny_config(dataset={"path": "train.jsonl", "val_path": "nope.jsonl"}),
        ["dataset.val_path", "file not found"],
    )
    cases["empty_path"] = (tiny_config(data=""), ["dataset.path", "at least 1 character"])
    (folder / "one_line.json").write_text(json.dumps(chat("q", "a")))
    cases["json_one_line_object"] = (tiny_config(data="one_line.json"), ["a .json dataset must be an array"])
    (folder / "latin1.jsonl").write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in fact_rows(6))
        + '{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'.encode("latin-1")
    )
    cases["jsonl_not_utf8"] = (tiny_config(data="latin1.jsonl"), ["latin1.jsonl:7", "byte 0xe9 on line 7", "iconv"])
    write_jsonl(folder / "all_bad.jsonl", [{"prompt": "q"}] * 3)
    cases["nothing_left_after_skip"] = (
        tiny_config(dataset={"path": "all_bad.jsonl", "on_invalid": "skip"}),
        ["no training rows are left: 3 row(s) read, 3 invalid and skipped", "line 1: messages"],
    )
    cases["test_size_too_large"] = (
        tiny_config(dataset={"path": "train.jsonl", "test_size": 8}),
        ["asks for 8 evaluation rows, but the dataset has 8 valid rows", "train.jsonl"],
    )
    (folder / "none.py").write_text("def score(prediction, reference, row):\n    prediction == reference\n")
    cases["custom_metric_returns_none"] = (
        tiny_config(evals={"benchmarks": [{"name": "g", "path": "gen.jsonl", "metric": "./none.py::score"}]}),
        ["returned None", "without `return`"],
    )
    (folder / "nan.py").write_text("def score(prediction, reference, row):\n    return float('nan')\n")
    cases["custom_metric_returns_nan"] = (
        tiny_config(evals={"benchmarks": [{"name": "g", "path": "gen.jsonl", "metric": "./nan.py::score"}]}),
        ["returned nan, not a finite number"],
    )
    (folder / "mcq.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "q"}], "options": ["a", "a"], "answer_id": 0}) + "\n"
    )
    cases["mcq_equal_options"] = (
        tiny_config(evals={"benchmarks": [{"name": "m", "path": "mcq.jsonl", "metric": "logprob_mcq"}]}),
        ["field 'options[1]'", "also options[0]"],
    )
    write_jsonl(folder / "dpo_rows.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}] * 4)
    dpo = tiny_config(training_type="dpo", data="dpo_rows.jsonl")
    dpo["training_config"].update(extends="DEFAULT_DPO", loss_type="foo")
    cases["dpo_loss_type"] = (dpo, ["training_config.loss_type is 'foo'", "sigmoid"])

    (folder / "empty_run").mkdir()
    cases["eval_checkpoint_without_model"] = (
        {
            "model_name": "tiny-lfm2",
            "checkpoint": "empty_run",
            "evals": {"benchmarks": [{"name": "g", "path": "gen.jsonl", "metric": "exact_match"}]},
        },
        ["checkpoint: ", "empty_run", "no model in this folder"],
    )

    kto = tiny_config(training_type="kto", data="kto.jsonl")
    kto["training_config"].update(extends="DEFAULT_KTO", per_device_eval_batch_size=1)
    write_jsonl(folder / "kto.jsonl", [{"prompt": "q", "completion": "a", "label": True}] * 4)
    cases["kto_eval_batch_of_one"] = (kto, ["per_device_eval_batch_size is 1", "KTO needs > 1"])
    # was: validate passed, then run died with TRL's ValueError and a traceback after the model had loaded
    kto_random = tiny_config(training_type="kto", data="kto.jsonl")
    kto_random["training_config"].update(extends="DEFAULT_KTO", train_sampling_strategy="random")
    cases["kto_random_order"] = (
        kto_random,
        ["train_sampling_strategy: random breaks KTO's KL estimate", "loss_type: apo_zero_unpaired"],
    )

    # was: refused for grpo, embedding and colbert with an empty "use one of: "
    write_jsonl(folder / "prompts.jsonl", [{"prompt": "1+1?", "solution": "2"}] * 8)
    grpo = tiny_config(training_type="grpo", data="prompts.jsonl", rewards=["accuracy"])
    grpo["training_config"] = {
        "extends": "DEFAULT_GRPO",
        "use_vllm": False,
        "metric_for_best_model": "eval_rewards/format/mean",
    }
    cases["grpo_best_metric_of_another_reward"] = (
        grpo,
        [
            "metric_for_best_model is 'eval_rewards/format/mean', which grpo evaluation does not log",
            "eval_reward, eval_reward_std, eval_frac_reward_zero_std, eval_rewards/accuracy/mean",
        ],
    )

    (folder / "empty_model").mkdir()  # (the message was cut after transformers' "from one of:")
    cases["model_folder_empty"] = (
        tiny_config(model_name="empty_model"),
        [
            (
                "empty_model: cannot load the tokenizer from the folder: it has no tokenizer files (tokenizer.json, "
                "tokenizer.model, vocab.json, tokenizer_config.json); it is empty"
            ),
            "fix: set model_name to a complete model folder",
        ],
    )

    (folder / "a_file").write_text("x")
    cases["output_dir_is_a_file"] = (tiny_config(output_dir="a_file"), ["output_dir", "a file, not a folder"])
    cases["output_dir_under_a_file"] = (tiny_config(output_dir="a_file/run"), ["a_file is a file"])
    cases["resume_without_checkpoint"] = (
        tiny_config(training_config={"resume_from_checkpoint": "latest"}),
        ["no complete checkpoint"],
    )
    return cases


def test_bad_files_and_folders_are_caught_by_validate_and_by_run(workdir, capsys):
    cases = _bad_files(workdir)
    for name, (config, expected) in cases.items():
        path = write_config(workdir, config, f"{name}.yaml")
        for command in ("validate", "run"):
            code, err = cli(command, str(path), capsys=capsys)
            assert code == 2, (name, command, err)
            assert err.startswith("error:") and "Traceback" not in err, (name, err)
            for text in expected:
                assert text in err, f"{name} / {command}: {text!r} not in\n{err}"
            assert err.count("error:") == 1, err
    assert not (workdir / "outputs").exists()


def test_an_sft_config_switched_to_grpo_says_what_grpo_uses_instead_of_max_length(workdir, capsys):
    """Was: "did you mean 'vllm_max_model_length'?" - a near spelling among GRPO's keys, for a key GRPO has not."""
    write_jsonl(workdir / "train.jsonl", [{"prompt": "1+1?", "solution": "2"}] * 8)
    path = write_config(workdir, tiny_config())  # (its training_config has max_length: 128)
    switched = (
        "--set",
        "training_type=grpo",
        "--set",
        "training_config.extends=DEFAULT_GRPO",
        "--set",
        "rewards=[accuracy]",
        "--set",
        "training_config.use_vllm=false",
    )
    for command in ("validate", "run"):
        code, err = cli(command, str(path), *switched, capsys=capsys)
        assert (
            code == 2
            and "training_config.max_length is a key of sft, distill, dpo, kto and colbert training, not of grpo" in err
        ), err
        assert "max_completion_length" in err.split("fix:")[1] and "did you mean" not in err, err


def test_an_output_dir_that_cannot_be_written_is_caught_before_training(workdir, capsys):
    import tempfile

    def writable(folder: str) -> bool:
        try:
            handle, name = tempfile.mkstemp(dir=folder)
        except OSError:
            return False
        Path(name).unlink()
        return True

    # /sys refuses new files even to root on these machines (a plain chmod does not stop root)
    folder = next(f for f in ("/sys", "/proc/sys") if Path(f).is_dir() and not writable(f))
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    path = write_config(workdir, tiny_config(output_dir=f"{folder}/leap-run"))
    for command in ("validate", "run"):
        code, err = cli(command, str(path), capsys=capsys)
        assert code == 2 and f"cannot write in {folder}" in err and "Traceback" not in err, err


def test_a_config_file_that_is_not_utf8(workdir, capsys):
    path = workdir / "latin1.yaml"
    path.write_bytes("model_name: tiny-lfm2\n# caf\xe9\ndataset: {path: train.jsonl}\n".encode("latin-1"))
    for command in ("validate", "run"):
        code, err = cli(command, str(path), capsys=capsys)
        assert code == 2 and "not UTF-8 text (byte 0xe9 on line 2)" in err and f"{path}:2" in err, err


def test_debug_works_anywhere_on_the_command_line(workdir, capsys):
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    path = write_config(workdir, tiny_config(training_config={"learning_rate": "fast"}))
    for args in (["validate", str(path), "--debug"], ["--debug", "validate", str(path)], [str(path), "--debug"]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "Traceback" in err and "learning_rate" in err, args


def test_values_given_as_text_are_coerced_like_a_command_line(workdir):
    from leap_finetune.validate.loader import load_config

    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    resolved = load_config(
        write_config(
            workdir,
            tiny_config(
                training_config={
                    "learning_rate": "1e-3",
                    "per_device_train_batch_size": "4",
                    "bf16": "false",
                    "run_name": 2024,
                }
            ),
        )
    )
    assert resolved.training["learning_rate"] == 1e-3
    assert resolved.training["per_device_train_batch_size"] == 4
    assert resolved.training["bf16"] is False and resolved.training["run_name"] == "2024"


def test_warnings_for_data_that_is_accepted(workdir, capsys):
    """Accepted, but said: folder entries that are not read, a system turn in mid-conversation, and
    on_invalid: skip dropping more than 10% of the rows."""
    folder = workdir / "data"
    (folder / "old").mkdir(parents=True)
    write_jsonl(folder / "old" / "v1.jsonl", fact_rows(4))
    (folder / "notes.txt").write_text("x")
    rows = fact_rows(10)
    rows[2] = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "system", "content": "Now be terse."},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "b"},
        ]
    }
    rows[5] = rows[6] = {"messages": [{"role": "user", "content": "no answer"}]}
    write_jsonl(folder / "train.jsonl", rows)
    path = write_config(workdir, tiny_config(data="data", dataset={"path": "data", "on_invalid": "skip"}))
    code, err = cli("validate", str(path), capsys=capsys)
    assert code == 0, err
    assert "not read (sub-folders and files that are not" in err and "notes.txt, old/" in err
    assert "warning (system_not_first)" in err and "1 row(s)" in err and "messages[2]" in err
    assert "20% of the rows (2 of 10) are invalid and skipped" in err


def test_a_kto_batch_of_one_row_is_said(workdir, capsys):
    write_jsonl(workdir / "kto.jsonl", [{"prompt": f"q{i}", "completion": "a", "label": bool(i % 2)} for i in range(9)])
    path = write_config(
        workdir,
        tiny_config(
            training_type="kto",
            data="kto.jsonl",
            training_config={"extends": "DEFAULT_KTO", "per_device_train_batch_size": 4},
        ),
    )
    code, err = cli("validate", str(path), capsys=capsys)
    assert code == 0, err
    assert "KTO: the last train batch holds 1 row (9 rows, per_device_train_batch_size 4)" in err
    write_jsonl(workdir / "kto.jsonl", [{"prompt": "q", "completion": "a", "label": True}] * 3)
    path = write_config(
        workdir,
        tiny_config(
            training_type="kto",
            dataset={"path": "kto.jsonl", "test_size": 1},
            training_config={"extends": "DEFAULT_KTO"},
        ),
    )
    code, err = cli("validate", str(path), capsys=capsys)
    assert code == 2 and "the eval split has 1 row" in err, err


def test_home_and_relative_paths_resolve_from_the_config_not_the_working_folder(tmp_path, monkeypatch, capsys):
    home, project, elsewhere = tmp_path / "home", tmp_path / "project", tmp_path / "elsewhere"
    for folder in (home, project, elsewhere):
        folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    write_jsonl(home / "train.jsonl", fact_rows(8))
    path = write_config(project, tiny_config(data="~/train.jsonl", training_config={"max_steps": 2, "save_steps": 2}))
    monkeypatch.chdir(elsewhere)
    code, err = cli("run", str(path), capsys=capsys)
    assert code == 0, err
    assert not (elsewhere / "outputs").exists()
    [run_dir] = list((project / "outputs" / "test").iterdir())
    assert (run_dir / "checkpoint-2").is_dir()
    # `latest` finds that run from yet another folder
    resumed = write_config(
        project,
        tiny_config(
            data="~/train.jsonl", training_config={"max_steps": 3, "save_steps": 2, "resume_from_checkpoint": "latest"}
        ),
        "resume.yaml",
    )
    monkeypatch.chdir(tmp_path)
    code, err = cli("run", str(resumed), capsys=capsys)
    assert code == 0, err
    assert f"resuming from {run_dir / 'checkpoint-2'}" in " ".join(err.split())


def test_model_init_kwargs_reach_from_pretrained(workdir, capsys):
    """Every key is forwarded: a model whose weights sit in a sub-folder loads only with `subfolder`,
    and `torch_dtype: bf16` (old name, short alias) loads bfloat16 weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    model_dir = workdir / "base"
    build_tiny_model("tiny-lfm2", tokenizer).save_pretrained(model_dir / "weights")
    tokenizer.save_pretrained(model_dir)
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    base = tiny_config(model_name="base", training_config={"max_steps": 1})
    without = write_config(workdir, base, "without.yaml")
    code, err = cli("run", str(without), capsys=capsys)
    assert code == 2 and "cannot load the model from the folder: it has no config.json" in err, err
    assert "the model is in the sub-folder weights/: set training_config.model_init_kwargs: {subfolder: weights}" in err
    with_kwargs = write_config(
        workdir,
        {
            **base,
            "training_config": {
                **base["training_config"],
                "model_init_kwargs": {"subfolder": "weights", "torch_dtype": "bf16"},
            },
        },
        "with.yaml",
    )
    code, err = cli("run", str(with_kwargs), capsys=capsys)
    assert code == 0, err
    [run_dir] = list((workdir / "outputs" / "test").iterdir())
    assert AutoModelForCausalLM.from_pretrained(run_dir / "model").dtype == torch.bfloat16


def test_quantization_and_flash_attention_need_their_libraries(workdir, capsys):
    import importlib.util

    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    build_tiny_model("tiny-lfm2", tokenizer).save_pretrained(workdir / "base")
    tokenizer.save_pretrained(workdir / "base")
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    quantized = {"model_init_kwargs": {"quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}}
    full = write_config(workdir, tiny_config(model_name="base", training_config=quantized), "full.yaml")
    code, err = cli("validate", str(full), capsys=capsys)
    assert code == 2 and "quantization_config is set for a full fine-tune" in err and "QLoRA" in err, err
    lora = write_config(
        workdir,
        tiny_config(model_name="base", training_config=quantized, peft_config={"extends": "DEFAULT_LORA"}),
        "lora.yaml",
    )
    assert importlib.util.find_spec("bitsandbytes") is None  # this machine: the library's absence is the case
    code, err = cli("validate", str(lora), capsys=capsys)
    assert code == 2 and "quantization_config needs bitsandbytes, which is not installed" in err, err
    assert importlib.util.find_spec("flash_attn") is None  # likewise: flash-attn is CUDA-only
    flash = write_config(
        workdir,
        tiny_config(training_config={"model_init_kwargs": {"attn_implementation": "flash_attention_2"}}),
        "flash.yaml",
    )
    code, err = cli("validate", str(flash), capsys=capsys)
    assert code == 2 and "flash_attention_2, which needs flash-attn; it is not installed here" in err, err
    bogus = write_config(
        workdir,
        tiny_config(
            model_name="base",
            training_config={"model_init_kwargs": {"quantization_config": {"quant_method": "nonsense"}}},
        ),
        "bogus.yaml",
    )
    code, err = cli("validate", str(bogus), capsys=capsys)
    assert code == 2 and "not a quantization config transformers accepts" in err, err


def test_a_failed_new_run_leaves_no_run_folder(workdir, capsys):
    """A mistake only the worker can find (here: weights missing from the model folder) removes the
    new run's folder, so the corrected config can reuse output_dir."""
    from leap_finetune.models.tiny import load_tiny_tokenizer

    (workdir / "empty_model").mkdir()
    load_tiny_tokenizer("tiny-lfm2").save_pretrained(workdir / "empty_model")
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    path = write_config(workdir, tiny_config(model_name="empty_model", output_dir="run"))
    code, err = cli("run", str(path), capsys=capsys)
    assert code == 2 and "cannot load the model" in err, err
    assert not (workdir / "run").exists()


def test_the_cpu_examples_validate(capsys):
    for name in ("quickstart.yaml", "dpo_tiny.yaml", "kto_tiny.yaml", "tools_quickstart.yaml", "grpo_tiny_warmup.yaml"):
        code, err = cli("validate", str(EXAMPLES / name), capsys=capsys)
        assert code == 0, (name, err)
        assert "valid" in err


def test_yaml_merge_keys_and_empty_blocks(workdir, capsys):
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    merged = workdir / "merged.yaml"
    merged.write_text(
        "model_name: tiny-lfm2\ndataset: {path: train.jsonl}\ntraining_config: &short\n"
        "  max_steps: 2\n  learning_rate: 1e-3\npeft_config:\n  extends: DEFAULT_LORA\n"
        "evals: null\n"
    )
    code, err = cli("validate", str(merged), capsys=capsys)
    assert code == 2 and "'evals:' is empty" in err, err
    merged.write_text(
        "model_name: tiny-lfm2\ndataset: {path: train.jsonl}\n"
        "training_config:\n  <<: {max_steps: 2, learning_rate: 5e-4}\n  max_steps: 3\n"
    )
    from leap_finetune.validate.loader import load_config

    training = load_config(merged).training
    assert (training["max_steps"], training["learning_rate"]) == (3, 5e-4)  # merged, then overridden
    empty_lora = workdir / "empty_lora.yaml"
    empty_lora.write_text("model_name: tiny-lfm2\ndataset: {path: train.jsonl}\npeft_config:\n")
    code, err = cli("validate", str(empty_lora), capsys=capsys)
    assert code == 2 and "'peft_config:' is empty" in err and "extends: DEFAULT_LORA" in err, err


def test_eval_output_is_checked_before_evaluating(workdir, capsys):
    (workdir / "bench.jsonl").write_text(json.dumps(chat("q", "b")) + "\n")
    config = write_config(
        workdir,
        {
            "model_name": "tiny-lfm2",
            "evals": {"benchmarks": [{"name": "b", "path": "bench.jsonl", "metric": "exact_match"}]},
        },
    )
    original = config.read_text()
    (workdir / "results").mkdir()
    code, err = cli("eval", str(config), "--output", str(workdir / "results"), capsys=capsys)
    assert code == 2 and "--output is a folder" in err and "benchmarks of" not in err, err
    code, err = cli("eval", str(config), "--output", str(config), capsys=capsys)
    assert code == 2 and "would overwrite an input" in err, err
    assert config.read_text() == original


def test_a_reward_mapping_without_a_name_is_a_message_not_a_traceback(workdir, capsys):
    """Regression: `rewards: [{pattern: x}]` was a KeyError: 'name' traceback in validate and run."""
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}] * 16)
    config = {
        "project_name": "g",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "training_config": {"use_vllm": False},
    }
    for rewards in ([{"pattern": "x"}], {"funcs": [{"pattern": "x"}, "accuracy"]}):
        path = write_config(workdir, {**config, "rewards": rewards})
        for command in ("validate", "run"):
            code, err = cli(command, str(path), capsys=capsys)
            assert code == 2 and "Traceback" not in err, err
            assert "rewards.funcs[0] is a mapping without a `name`" in err and "{name: format" in err, err
    assert not (workdir / "outputs").exists()
