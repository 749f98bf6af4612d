"""The command line's words (cli_words.py): a misspelt command is named with the closest one, a config named like a
command still runs, and every option's value is never taken for a command. In-process, as tests/e2e/test_mistakes.py."""

from __future__ import annotations

import pytest

from tests.conftest import fact_rows, tiny_config, write_config, write_jsonl
from tests.e2e.test_mistakes import cli


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["valdate", "x.yaml"], "unknown command 'valdate' (did you mean 'validate'?)"),
        (["plna"], "unknown command 'plna' (did you mean 'plan'?)"),
        (["--debug", "inpsect", "x.yaml", "--rows", "2"], "unknown command 'inpsect' (did you mean 'inspect'?)"),
        (["frobnicate", "x.yaml"], "unknown command 'frobnicate'"),
        # other tools' words (and near them, closer than to any command here: `resum` was offered 'slurm')
        (["resume", "x.yaml"], "unknown command 'resume' (a run resumes with `leap-finetune run CONFIG --set"),
        (["resum", "x.yaml"], "training_config.resume_from_checkpoint=latest`)"),
        (["train", "x.yaml"], "unknown command 'train' (did you mean 'run'?)"),
        (["evalute", "x.yaml"], "unknown command 'evalute' (did you mean 'eval'?)"),
        (["convert", "x.yaml"], "(did you mean 'export'? (`export RUN --gguf q4_k_m` writes a GGUF file))"),
    ],
)
def test_a_misspelt_command_is_named_not_run_as_a_config(argv, expected, workdir, capsys):
    write_jsonl(workdir / "x.yaml", [])  # (the config named after it exists: the first word is still no config)
    code, err = cli(*argv, capsys=capsys)
    assert code == 2 and expected in err and "the commands are chat, eval" in err, err
    assert "Got unexpected extra argument" not in err


def test_a_config_whose_name_is_close_to_a_command_still_runs_as_a_config(workdir, capsys):
    """`leap-finetune plan.yaml`, or a file named like a command that exists, is a config (not a misspelling)."""
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    path = write_config(workdir, tiny_config(), "plan.yaml")
    code, err = cli("validate", str(path), capsys=capsys)
    assert code == 0, err
    import os

    previous = os.getcwd()
    os.chdir(workdir)
    try:
        (workdir / "valid").write_text(path.read_text())  # (a config file without an extension, named "valid")
        code, err = cli("valid", "--set", "training_config.max_steps=abc", capsys=capsys)
    finally:
        os.chdir(previous)
    assert code == 2 and "training_config.max_steps is 'abc'" in err and "unknown command" not in err, err


def test_every_option_that_takes_a_value_is_known_to_the_command_words():
    """Was: `leap-finetune --gpu-memory 24GiB x.yaml` refused as "unknown command '24GiB'" (the option's value read
    as the command). Every option of every command that takes a value is listed in cli_words.VALUE_OPTIONS."""
    import typer

    from leap_finetune.cli import app
    from leap_finetune.cli_words import VALUE_OPTIONS

    group = typer.main.get_command(app)
    taking = {
        opt
        for command in group.commands.values()
        for param in command.params
        if param.param_type_name == "option" and not param.is_flag
        for opt in param.opts
    }
    assert taking - VALUE_OPTIONS == set()
