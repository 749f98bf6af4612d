"""The command line's words before typer reads them: `--debug` anywhere, `leap-finetune CONFIG.yaml` as `run
CONFIG.yaml`, and a misspelt command said as such (not run as a config with extra arguments)."""

from __future__ import annotations

import sys
from pathlib import Path

SUBCOMMANDS = {"run", "validate", "inspect", "eval", "plan", "slurm", "init", "chat", "export", "migrate"}
# options that take a value: the word after them is not a positional argument
VALUE_OPTIONS = {
    "--set",
    "--type",
    "-t",
    "--model",
    "--prompt",
    "-p",
    "--system",
    "--image",
    "-i",
    "--max-new-tokens",
    "--temperature",
    "--rows",
    "-n",
    "--gpus",
    "--nodes",
    "--gpus-per-node",
    "--output",
    "-o",
    "--server",
    "--server-model",
    "--server-timeout",
    "--gpu-memory",
    "--gguf",
    "--llama-cpp",
    "--max-drop",
    "--max-kl",
}


def command_words(args: list[str]) -> list[str]:
    # --debug is a global option; accept it anywhere (`leap-finetune run x.yaml --debug`).
    if "--debug" in args:
        args = ["--debug"] + [a for a in args if a != "--debug"]
    # `leap-finetune CONFIG.yaml` means `leap-finetune run CONFIG.yaml`. (The word after an option that
    # takes a value, such as `--set KEY=VALUE`, is not a positional argument.)
    positional = [
        a for i, a in enumerate(args) if not a.startswith("-") and not (i > 0 and args[i - 1] in VALUE_OPTIONS)
    ]
    if positional and positional[0] not in SUBCOMMANDS:
        _refuse_unknown_command(positional[0], args)
        args.insert(1 if args[:1] == ["--debug"] else 0, "run")  # (options before the config are run's)
    return args


# Commands people bring from other tools (or expect): what does it here. Matched before the commands themselves, so
# that `resum` is not offered `slurm`.
OTHER_TOOLS_WORDS = {
    "resume": "a run resumes with `leap-finetune run CONFIG --set training_config.resume_from_checkpoint=latest`",
    "train": "did you mean 'run'?",
    "finetune": "did you mean 'run'?",
    "evaluate": "did you mean 'eval'?",
    "convert": "did you mean 'export'? (`export RUN --gguf q4_k_m` writes a GGUF file)",
    "merge": "did you mean 'export'? (`export RUN --merge` merges a LoRA adapter)",
}


def _other_tools_word(word: str) -> str | None:
    """What to say for a word of another tool's: typed as it is, or closer to it than to any command here."""
    from difflib import SequenceMatcher

    word = word.lower()
    if word in OTHER_TOOLS_WORDS:
        return OTHER_TOOLS_WORDS[word]

    def closest(words) -> tuple[float, str]:
        return max((SequenceMatcher(None, word, w).ratio(), w) for w in words)

    ratio, other = closest(OTHER_TOOLS_WORDS)
    return OTHER_TOOLS_WORDS[other] if ratio >= 0.8 and ratio > closest(SUBCOMMANDS)[0] else None


def _refuse_unknown_command(word: str, args: list[str]) -> None:
    """`leap-finetune valdate x.yaml` is a misspelt command, not `run valdate x.yaml`: a first word that is no file
    here and does not read as a config's name (.yaml, .yml, .json, or a path), with more words after it or close to
    a command, is refused (exit 2) with the closest command."""
    from leap_finetune.config.suggest import did_you_mean

    looks_like_a_config = word.endswith((".yaml", ".yml", ".json")) or "/" in word or Path(word).exists()
    if looks_like_a_config:
        return
    hint = _other_tools_word(word) or did_you_mean(word, sorted(SUBCOMMANDS))
    if not hint and args.index(word) == len(args) - 1:
        return  # (a lone word far from every command is run's config: run says it is not found)
    print(
        f"error: unknown command {word!r}" + (f" ({hint})" if hint else "") + "\n"
        f"  fix: the commands are {', '.join(sorted(SUBCOMMANDS))}; `leap-finetune CONFIG.yaml` runs a config "
        "(leap-finetune --help)",
        file=sys.stderr,
    )
    raise SystemExit(2)
