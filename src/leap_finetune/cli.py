"""The `leap-finetune` command: thin. Parses arguments, calls the API, maps user errors to exit 2."""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import traceback
from pathlib import Path

import typer
from rich.console import Console

from leap_finetune.cli_words import command_words
from leap_finetune.errors import LeapError, RunFailed
from leap_finetune.methods import training_types
from leap_finetune.signals import Stopped

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Fine-tune LFM2 / LFM2.5 (and any Hugging Face causal LM) from one YAML file.\n\n"
    "`leap-finetune CONFIG.yaml` is the same as `leap-finetune run CONFIG.yaml`.",
)
_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors.")) -> None:
    _state["debug"] = debug


def _user_errors(command):
    """A LeapError is the user's to fix: one message, exit code 2, no traceback (unless --debug)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except LeapError as err:
            if _state["debug"]:  # the traceback too, and the same exit code (a script's check must not change)
                traceback.print_exc()
            print(f"error: {err.format()}", file=sys.stderr)
            raise typer.Exit(2) from None
        except RunFailed as err:  # the run started and failed (a worker died): exit 1, one message
            if _state["debug"]:
                traceback.print_exc()
            print(f"error: {err}", file=sys.stderr)
            raise typer.Exit(1) from None
        except Stopped as err:  # Ctrl-C / SIGTERM outside the training loop, or a second one: 128 + signal
            print(err.message(), file=sys.stderr)
            if err.at_once:
                # "at once": not after the threads of libraries finish what they are waiting for (measured: a
                # hanging judge's requests held the exit for their timeout); the run folder is consistent
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(128 + err.signum)
            raise typer.Exit(128 + err.signum) from None
        except KeyboardInterrupt:  # Ctrl-C in a command that saves nothing (validate, plan, inspect, ...)
            if _state["debug"]:
                raise
            print("stopped by SIGINT (Ctrl-C)", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper


def _config_arg():
    return typer.Argument(..., help="The YAML config file.", show_default=False)


def _set_option():
    return typer.Option(
        None,
        "--set",
        metavar="KEY=VALUE",
        help="Override a value of the YAML (repeatable), e.g. --set training_config.learning_rate=1e-4 "
        "--set dataset.limit=1000; list items as 'dataset[1].epochs=2' or dataset.1.epochs=2; values as in "
        "YAML ('evals.benchmarks=[]'). Checked like the file.",
    )


def _no_config_set_option():
    """--set on a command that reads no config: accepted by the parser so that the refusal can say why."""
    return typer.Option(None, "--set", hidden=True, metavar="KEY=VALUE")


def _refuse_set(sets: list[str] | None, command: str, instead: str) -> None:
    if sets:
        raise LeapError(
            f"`{command}` reads no config, so --set has no value to override",
            where="--set",
            fix=f"{instead}; --set overrides a config's values on run, validate, inspect, plan, eval and slurm",
        )


def _source(config: Path, sets: list[str] | None, gpu_memory: str | None = None):
    """The config path, or with --set (and --gpu-memory) the config loaded with the overrides (the API takes both)."""
    if gpu_memory is not None and any(item.partition("=")[0].strip() == "gpu_memory" for item in sets or []):
        raise LeapError(  # (one would silently win over the other)
            "--gpu-memory and --set gpu_memory=... both give the GPU's memory",
            where="--gpu-memory",
            fix="give it once: --gpu-memory 24GiB (or --set gpu_memory=24GiB)",
        )
    # (an empty --gpu-memory "" is checked as --set gpu_memory= is, not dropped: it was read as no budget at all)
    sets = [*(sets or []), f"gpu_memory={gpu_memory}"] if gpu_memory is not None else sets
    if not sets:
        return config
    from leap_finetune.validate.loader import load_config

    return load_config(config, overrides=sets)


GPU_MEMORY = typer.Option(
    None,
    "--gpu-memory",
    help="Plan for a GPU with this much memory (24GiB, 80GB, 16): unset defaults change to fit (docs/memory.md).",
)


@app.command()
@_user_errors
def run(config: Path = _config_arg(), sets: list[str] = _set_option(), gpu_memory: str = GPU_MEMORY) -> None:
    """Validate the config and every dataset row, plan the run, and train."""
    from leap_finetune.api import run_config

    summary = run_config(_source(config, sets, gpu_memory))
    if summary.get("stopped_by_signal"):
        raise typer.Exit(128 + summary["stopped_by_signal"])


@app.command()
@_user_errors
def validate(config: Path = _config_arg(), sets: list[str] = _set_option(), gpu_memory: str = GPU_MEMORY) -> None:
    """Check the config and EVERY dataset row; no model is loaded, nothing is trained.

    Exit code 0 when everything is valid, 2 when not."""
    from leap_finetune.api import validate_config

    validate_config(_source(config, sets, gpu_memory))
    Console(stderr=True).print("[green]valid[/green]")


@app.command("plan")
@_user_errors
def plan(
    config: Path = _config_arg(),
    gpus: int = typer.Option(None, "--gpus", min=0, help="Plan for N GPUs per node (default: the GPUs visible here)."),
    nodes: int = typer.Option(None, "--nodes", min=1, help="Plan for M nodes (default: 1, or the Ray cluster's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON to stdout."),
    sets: list[str] = _set_option(),
    gpu_memory: str = GPU_MEMORY,
) -> None:
    """Show what a run would do - which GPU does what, workers, batch sizes, steps, and every process
    with its command and CUDA_VISIBLE_DEVICES - without starting anything or loading the model (tokens are
    counted when its tokenizer is here: built in, a folder, the Hugging Face cache)."""
    from leap_finetune.api import plan_config

    report = plan_config(_source(config, sets, gpu_memory), gpus=gpus, nodes=nodes)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    from leap_finetune.launch.reports.show import print_plan

    print_plan(Console(), report)


@app.command("slurm")
@_user_errors
def slurm(
    config: Path = _config_arg(),
    nodes: int = typer.Option(None, "--nodes", min=1, help="Nodes to allocate (default: slurm.nodes, 1)."),
    gpus_per_node: int = typer.Option(
        None, "--gpus-per-node", min=0, help="GPUs per node (default: slurm.gpus_per_node, 0)."
    ),
    submit: bool = typer.Option(False, "--submit", help="Submit the job with sbatch (else only write the script)."),
    sets: list[str] = _set_option(),
) -> None:
    """Write an sbatch script that brings up a Ray cluster over the allocation and runs the config on it
    (checked with `sbatch --test-only`); with --submit, submit it and print the job id and its log."""
    from leap_finetune.api import slurm_config

    slurm_config(_source(config, sets), nodes=nodes, gpus_per_node=gpus_per_node, submit=submit)


@app.command("eval")
@_user_errors
def evaluate(
    config: Path = _config_arg(),
    output: Path = typer.Option(None, "--output", "-o", help="Write the results as JSON here."),
    server: str = typer.Option(
        None,
        "--server",
        help="Base URL of an OpenAI-compatible server (vLLM, transformers "
        "serve, llama.cpp), e.g. http://127.0.0.1:8000/v1: it answers the generation "
        "benchmarks; log-prob benchmarks still run through transformers.",
    ),
    server_model: str = typer.Option(
        None, "--server-model", help="The model name to ask the server for (default: the first model it lists)."
    ),
    server_timeout: float = typer.Option(
        300.0,
        "--server-timeout",
        min=1.0,
        help="Seconds to wait for one answer from --server (asked twice) before failing, naming the server.",
    ),
    sets: list[str] = _set_option(),
) -> None:
    """Run the config's evals: benchmarks on `checkpoint` (a run or checkpoint folder, an adapter, or a
    .gguf file from export --gguf) or `model_name`, without training."""
    from leap_finetune.api import evaluate_config

    evaluate_config(
        _source(config, sets), output=output, server=server, server_model=server_model, server_timeout=server_timeout
    )


@app.command()
@_user_errors
def inspect(
    config: Path = _config_arg(),
    rows: int = typer.Option(3, "--rows", "-n", min=1, help="How many training rows to show."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array to stdout instead of coloured text."),
    sets: list[str] = _set_option(),
) -> None:
    """Show the first training rows exactly as the model sees them, with the tokens that carry
    loss highlighted (or, with --json, their character spans)."""
    from leap_finetune.api import inspect_config

    items = inspect_config(_source(config, sets), rows=rows)
    if as_json:
        sys.stdout.write(json.dumps(items, ensure_ascii=False, indent=2) + "\n")
        return
    from rich.text import Text

    from leap_finetune.cli_show import (
        TRAINED_STYLE,
        show_conversation,
        show_preference_row,
        show_prompt_row,
        show_retrieval_row,
    )

    console = Console()
    grpo = bool(items) and "prompt_tokens" in items[0] and "solution" in items[0]
    for item in items:
        if grpo:
            show_prompt_row(console, item)
            continue
        console.rule(
            f"row {item['row']}  ({item['source']['file']}, {item['source']['location']}; "
            f"{item['tokens']} tokens, {item['trained_tokens']} trained)"
        )
        if "query" in item:
            show_retrieval_row(console, item)
        elif "text" in item:
            show_conversation(console, item)
        else:
            show_preference_row(console, item)
    if grpo or any("query" in item for item in items):  # generated / retrieval rows: nothing is highlighted
        return
    console.print(
        Text.assemble(("highlighted", TRAINED_STYLE), " text carries loss")
        + (Text("; struck-through text is cut by max_length") if any("truncated_at" in i for i in items) else Text(""))
    )


@app.command("init")
@_user_errors
def init(
    output: Path = typer.Argument(Path("config.yaml"), help="Where to write the config."),
    training_type: str = typer.Option(
        "sft", "--type", "-t", help=", ".join(training_types()[:-1]) + f" or {training_types()[-1]}."
    ),
    model: str = typer.Option("tiny-lfm2", "--model", help="The model to fine-tune (a Hub id, LFM2-1.2B, a folder)."),
    force: bool = typer.Option(False, "--force", help="Replace the file if it exists."),
    sets: list[str] = _no_config_set_option(),
) -> None:
    """Write a commented starter config for a training type, linked to the config's JSON schema for
    completion and checking in your editor."""
    from leap_finetune.config.starters import schema_path, starter
    from leap_finetune.config.suggest import did_you_mean

    _refuse_set(
        sets,
        "init",
        f"write the starter, then edit it or give --set to the command that reads it, e.g. "
        f"leap-finetune validate {output} --set {shlex.quote(sets[0]) if sets else 'KEY=VALUE'}",
    )
    types = training_types()
    if training_type not in types:
        raise LeapError(
            f"unknown training type '{training_type}'",
            where="--type",
            fix=(did_you_mean(training_type, types) + " " if did_you_mean(training_type, types) else "")
            + "one of: "
            + ", ".join(types),
        )
    if output.exists() and not force:
        raise LeapError("the file exists", where=str(output), fix="choose another name, or add --force to replace it")
    if output.suffix not in (".yaml", ".yml"):
        raise LeapError(
            f"a config is a YAML file, not '{output.suffix or output.name}'",
            where=str(output),
            fix="name it e.g. config.yaml",
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    from leap_finetune.methods import method_of
    from leap_finetune.models.vision import is_vision_model

    vision = method_of(training_type).images and is_vision_model(model)
    output.write_text(starter(training_type, model, str(output), vision=vision), encoding="utf-8")
    console = Console(stderr=True)
    console.print(
        f"wrote {output} ({training_type} on {model}); put your rows in data/train.jsonl (the format is "
        f"in the file), then: leap-finetune validate {output}"
    )
    console.print(f"editor completion: the first line points the YAML language server at {schema_path()}", markup=False)


@app.command("migrate")
@_user_errors
def migrate(
    config: Path = typer.Argument(..., help="A config of the original system (liquid-finetune).", show_default=False),
    output: Path = typer.Option(None, "--output", "-o", help="Where to write it; default: NAME.migrated.yaml."),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    """Rewrite a config of the original system (Liquid4All's leap-finetune / liquid-finetune) in our keys, with a
    comment at each change (docs/migrating.md)."""
    from leap_finetune.config.migrate import migrate as convert

    written, changes = convert(config, output, force)
    console = Console(stderr=True, soft_wrap=True)
    for change in changes:
        console.print(("NEEDS YOU: " if change.refused else "") + change.said(), markup=False)
    refused = [c for c in changes if c.refused]
    console.print(f"wrote {written} ({len(changes)} change(s)); next: leap-finetune validate {written}", markup=False)
    if refused:
        print(
            f"error: {len(refused)} key(s) of {config} have no equivalent that keeps their meaning; "
            f"{written} marks them NEEDS YOU at its top - edit them before training",
            file=sys.stderr,
        )
        raise typer.Exit(2)


@app.command("chat")
@_user_errors
def chat_command(
    model: str = typer.Argument(..., help="A run folder, checkpoint-N, adapter or model folder, or a model id."),
    prompt: str = typer.Option(None, "--prompt", "-p", help="Print one answer to this prompt and exit."),
    system: str = typer.Option(None, "--system", help="A system message first."),
    images: list[str] = typer.Option(
        None,
        "--image",
        "-i",
        metavar="FILE",
        help="An image (a file or an http(s) URL) for a vision-language model (LFM2-VL), repeatable: it goes "
        "with --prompt, or with the first message of the conversation (/image PATH attaches one later).",
    ),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="Answer length limit."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0: greedy (the default)."),
    sets: list[str] = _no_config_set_option(),
) -> None:
    """Chat with a trained model in the terminal (its LoRA adapter over the base model, the chat template
    it was trained with); --prompt for a single answer on stdout; --image to show a vision-language model
    an image. Not for embedding or ColBERT models."""
    _refuse_set(
        sets,
        "chat",
        "chat talks to a trained model as it is; its settings are options (--system, "
        "--temperature, --max-new-tokens, --image: leap-finetune chat --help)",
    )
    from leap_finetune.chat import chat

    reply = chat(
        model,
        prompt=prompt,
        system=system,
        images=images,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )
    if reply is not None:
        sys.stdout.write(reply + "\n")


@app.command("export")
@_user_errors
def export(
    model: str = typer.Argument(..., help="A run folder, checkpoint-N folder or adapter folder."),
    merge: bool = typer.Option(False, "--merge", help="Merge a LoRA adapter into its base model: a full model."),
    output: Path = typer.Option(
        None,
        "--output",
        "-o",
        help="The folder to write (default: export/, export-merged/ or export-gguf/ inside the given folder).",
    ),
    gguf: list[str] = typer.Option(
        None,
        "--gguf",
        help="Write GGUF files for llama.cpp, Ollama, LM Studio: f16, bf16, q8_0, f32 (llama.cpp's converter), "
        "q4_k_m, q5_k_m, q6_k, ... (llama.cpp's llama-quantize). Repeat it or give a comma list; each file is "
        "verified on the run's benchmarks. auto: the smallest of q8_0 ... q4_0 that keeps the scores.",
    ),
    llama_cpp: Path = typer.Option(
        None, "--llama-cpp", help="A llama.cpp build folder holding llama-quantize (default: PATH)."
    ),
    no_verify: bool = typer.Option(
        False, "--no-verify", help="With --gguf: skip running the run's benchmarks on each file."
    ),
    max_drop: float = typer.Option(
        None, "--max-drop", help="With --gguf auto: the most any benchmark's score may drop (default 0.02)."
    ),
    max_kl: float = typer.Option(
        None, "--max-kl", help="With --gguf auto: the most KL from the original, nats per token (default 0.05)."
    ),
    no_speed: bool = typer.Option(
        False, "--no-speed", help="With --gguf: skip measuring each file's speed on this CPU (llama-bench)."
    ),
    gguf_adapter: bool = typer.Option(
        False, "--gguf-adapter", help="With --gguf: a LoRA run's base in those types, its adapter as a GGUF file."
    ),
    checkpoints: bool = typer.Option(
        False, "--checkpoints", help="With --gguf: every checkpoint of the run exported, scored and timed."
    ),
    sets: list[str] = _no_config_set_option(),
) -> None:
    """Write a trained model as a folder of its own (model, tokenizer, the chat template it trained with);
    --merge merges a LoRA adapter into its base for vLLM or plain transformers; --gguf writes GGUF files (LoRA
    merged) with the quantization loss on the run's benchmarks. An embedding or ColBERT model is written as a
    sentence-transformers folder, always merged."""
    _refuse_set(
        sets,
        "export",
        "export writes a trained model as it is (its options: --merge, --gguf, --output); to train "
        "with other values, give --set to run",
    )
    from leap_finetune.gguf_export.command import export_command

    gguf_options = {"llama_cpp": llama_cpp, "no_verify": no_verify, "no_speed": no_speed, "adapter": gguf_adapter,
                    "checkpoints": checkpoints, "max_drop": max_drop, "max_kl": max_kl}  # fmt: skip
    export_command(model, merge, output, gguf, gguf_options)


def main(argv: list[str] | None = None) -> None:
    args = command_words(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app(args=args, prog_name="leap-finetune")  # click exits: 0, 2 for usage errors, or a command's code


if __name__ == "__main__":
    main()
