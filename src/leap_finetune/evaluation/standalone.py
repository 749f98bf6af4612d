"""`leap-finetune eval`: the `evals:` block on a trained model, without training.

`checkpoint:` may be a run folder (its final model, else its newest complete checkpoint), a
`checkpoint-N` folder, a LoRA adapter (a LoRA run's `checkpoint-N` or `adapter/`): an adapter is
loaded over its base model - or a GGUF file (`leap-finetune export --gguf`), which transformers reads dequantised:
the scores are those of the quantized weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of
from leap_finetune.models.trained import TrainedModel, trained_in, unmerged_lora
from leap_finetune.runs.folder import RunFolder


def evaluate_config(
    source,
    *,
    output: str | Path | None = None,
    console: Console | None = None,
    server: str | None = None,
    server_model: str | None = None,
    float32: bool = False,
    server_timeout: float | None = None,
) -> dict:
    """Run the `evals:` block on `checkpoint` (a run, checkpoint or adapter folder) or `model_name`,
    without training. Writes the results as JSON to `output` when given. `server`: the base URL of an
    OpenAI-compatible server that answers the generation benchmarks, images sent as image_url parts
    (evaluation/server.py); log-prob ones still run here, images through the model's processor."""
    from leap_finetune.evaluation.rows import is_logprob
    from leap_finetune.validate.loader import load_config

    console = console or Console(stderr=True)
    resolved = source if isinstance(source, ResolvedConfig) else load_config(source)
    target, benchmarks = _check_before_loading(resolved, output, server, console)
    if resolved.retrieval is not None:  # an embedding / ColBERT model on retrieval benchmarks
        report = _evaluate_retrieval(resolved, target, benchmarks, console)
    else:
        generator = _server_generator(server, server_model, console, server_timeout)
        if generator is not None and not any(is_logprob(b.metric) for b in benchmarks):
            report = _evaluate_on_server(resolved, benchmarks, generator, output, console)
        else:
            report = _evaluate_here(resolved, target, benchmarks, generator, output, console, float32)
    _write_report(report, output, console)
    return report


def _check_before_loading(resolved: ResolvedConfig, output, server: str | None, console: Console):
    """(the model to evaluate, its benchmarks): everything that can be refused is, before any model loads."""
    add_run_unseen_tools(resolved, console)
    if resolved.evals is None:
        raise LeapError(
            "the config has no benchmarks to run (no evals: block, or evals.benchmarks is empty)",
            where=resolved.config_path or "config",
            fix="add evals: with benchmarks (see docs/evaluation.md)",
        )
    target = model_to_evaluate(resolved)
    if target.gguf_file is not None:
        from leap_finetune.evaluation.runner import load_benchmarks

        # (the rows first, without decoding pictures: a GGUF file refuses image benchmarks anyway)
        check_gguf_evaluable(
            target.gguf_file,
            resolved,
            load_benchmarks(resolved.evals, vision=True, model_name=resolved.model_name),
            server,
        )
    benchmarks = check_benchmarks(resolved, resolved.model_id if target.gguf_file else target.model_id)
    if output is not None:
        _check_output(Path(output), resolved)
    episodes = [b.name for b in benchmarks if b.metric == "episodes"]
    if episodes and server:
        raise LeapError(
            f"benchmark(s) {', '.join(episodes)} (metric episodes) run their tools here, between the model's turns; "
            "--server answers one turn at a time",
            where="--server",
            fix="leave out --server to play the episodes on the model in this process, or remove those benchmarks "
            "(--set 'evals.benchmarks=[...]')",
        )
    if resolved.retrieval is not None and server:
        raise LeapError(
            "--server answers generation benchmarks; retrieval benchmarks encode with the model itself",
            where="--server",
            fix="leave out --server for an embedding/ColBERT config",
        )
    return target, benchmarks


def _server_generator(server: str | None, server_model: str | None, console: Console, timeout: float | None = None):
    """The server that answers the generation benchmarks (--server), asked first: a wrong URL fails now."""
    if not server:
        return None
    from leap_finetune.evaluation.server import DEFAULT_TIMEOUT_S, ServerGenerator

    generator = ServerGenerator(server, server_model, timeout_s=timeout or DEFAULT_TIMEOUT_S)
    console.print(f"generation benchmarks: {generator.model} at {generator.base_url}")
    return generator


def _evaluate_on_server(resolved: ResolvedConfig, benchmarks, generator, output, console: Console) -> dict:
    """Generation benchmarks only: nothing loads here, the server answers."""
    from leap_finetune.evaluation.runner import print_summary, run_benchmarks

    predictions = predictions_dir(output)
    results = run_benchmarks(None, None, resolved.evals, benchmarks, predictions_dir=predictions, server=generator)
    print_summary(console, results, None, f"of {generator.model} at {generator.base_url}")
    return {"model": generator.model, "server": generator.base_url, "results": results}


def _evaluate_here(
    resolved: ResolvedConfig, target: TrainedModel, benchmarks, generator, output, console: Console, float32: bool
) -> dict:
    """The benchmarks on the model loaded in this process (the generation ones on `generator` when given)."""
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.data.render import Renderer
    from leap_finetune.evaluation.runner import print_summary, run_benchmarks
    from leap_finetune.quiet import quiet_libraries

    quiet_libraries()
    model, tokenizer = _load(target, resolved, float32)
    renderer = Renderer(tokenizer, load_chat_template(resolved.chat_template, tokenizer), "all", None)
    predictions = predictions_dir(output)
    processor = _processor_for(target.model_id, resolved.model_id, tokenizer, benchmarks)
    results = run_benchmarks(
        model, renderer, resolved.evals, benchmarks, predictions_dir=predictions, processor=processor, server=generator
    )
    print_summary(
        console,
        results,
        None,
        f"of {target.name}" + (f" (generation: {generator.model} at {generator.base_url})" if generator else ""),
    )
    report = {"model": str(target.gguf_file or target.adapter_dir or target.model_id), "results": results}
    if generator is not None:
        report.update(server=generator.base_url, server_model=generator.model)
    if target.adapter_dir is not None:
        report["base_model"] = target.model_id
    return report


def _load(target: TrainedModel, resolved: ResolvedConfig, float32: bool):
    """(model, tokenizer) with the eval config's model_init_kwargs (not the run's: the config says how to load);
    a LoRA adapter merged into its base; a GGUF file dequantised."""
    import torch

    from leap_finetune.models.loading import load_model, load_tokenizer

    init_kwargs = {k: v for k, v in (resolved.training.get("model_init_kwargs") or {}).items() if k != "dtype"}
    if float32:  # (export --gguf's original: as the GGUF files are read, float32 and not re-quantized)
        init_kwargs.pop("quantization_config", None)
    if target.gguf_file is not None:
        from leap_finetune.models.gguf import load_gguf

        model, tokenizer = load_gguf(target.gguf_file)
    else:
        tokenizer = load_tokenizer(target.model_id, init_kwargs)
        model = load_model(
            target.model_id,
            tokenizer,
            init_kwargs,
            dtype=torch.bfloat16 if torch.cuda.is_available() and not float32 else torch.float32,
        )
    if target.adapter_dir is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, str(target.adapter_dir)).merge_and_unload()
        except Exception as err:  # noqa: BLE001 - an adapter for another base model
            raise LeapError(
                f"cannot load the LoRA adapter over {target.model_id}: {str(err).splitlines()[0]}",
                where=f"checkpoint: {target.adapter_dir}",
                fix="set model_name to the base model the adapter was trained on",
            ) from None
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, tokenizer


def check_gguf_evaluable(path: Path, resolved, benchmarks, server: str | None = None) -> None:
    """Before anything loads: the file is a language model transformers can read, and no benchmark needs what a
    GGUF language model file does not hold (pictures: the projector is in the separate mmproj file; a server given
    with --server answers the generation ones)."""
    from leap_finetune.evaluation.rows import is_logprob
    from leap_finetune.evaluation.runner import has_images

    if resolved.retrieval is not None:
        raise LeapError(
            "a GGUF file is a chat model; retrieval benchmarks need the embedding / ColBERT model",
            where=f"checkpoint: {path}",
            fix="point checkpoint at the retrieval run's folder or its model/",
        )

    from leap_finetune.models.gguf import header

    architecture = header(path).get("general.architecture")
    if architecture == "clip":
        raise LeapError(
            "this is a projector (mmproj) file: the vision encoder of a vision-language model, not a language model",
            where=f"checkpoint: {path}",
            fix="give the model's .gguf file (the one without the mmproj- prefix)",
        )
    if has_images([b for b in benchmarks if not server or is_logprob(b.metric)]):
        raise LeapError(
            "image benchmarks cannot run on a GGUF file through transformers (it reads the language model only; "
            "the vision encoder is in the separate mmproj file)",
            where=f"checkpoint: {path}",
            fix="serve the model with its projector (llama-server -m FILE --mmproj MMPROJ_FILE) and run leap-finetune "
            "eval --server http://127.0.0.1:8080/v1; or evaluate the transformers model",
        )


def check_benchmarks(resolved: ResolvedConfig, model_id: str | None = None):
    """Every benchmark row (and custom metric) is validated before any model loads; image rows need
    a vision-language model and, for its processor, torchvision."""
    if resolved.evals is None:
        return []
    from leap_finetune.evaluation.runner import has_images, load_benchmarks
    from leap_finetune.models.vision import is_vision_model, require_torchvision

    model_id = model_id or resolved.model_id
    from leap_finetune.models.loading import missing_folder

    # a folder another config's run makes is not there yet: whether it takes images is not known, so its image rows
    # are read (they were refused as for a text-only model); validate then names the missing folder, plan plans
    unknown = missing_folder(model_id) is not None
    vision = unknown or is_vision_model(model_id)
    benchmarks = load_benchmarks(
        resolved.evals, vision=vision, model_name=resolved.model_name, environment=resolved.environment
    )
    if vision and has_images(benchmarks):
        if not unknown:
            require_torchvision(model_id)
        _decode_images(benchmarks)
    return benchmarks


def _decode_images(benchmarks) -> None:
    """Every local picture of the benchmarks decoded now (a truncated or unreadable one would fail the evaluation
    at step 0, or mid-run), each problem naming the benchmark's file and row. URLs are fetched when evaluated."""
    from leap_finetune.data.images import ImageProblem, open_image
    from leap_finetune.errors import DataError, RowProblem

    problems = []
    for bench in benchmarks:
        for item in bench.items:
            for number, source in enumerate(item.images):
                if source.startswith(("http://", "https://")):
                    continue
                try:
                    open_image(source)
                except ImageProblem as err:
                    problems.append(RowProblem(item.file, item.location, f"image {number + 1}", str(err)))
    if problems:
        raise DataError(
            problems=problems,
            total_rows=sum(len(b.items) for b in benchmarks),
            fix_text="replace or remove the listed pictures of the benchmark rows (evals.benchmarks)",
            title="benchmarks",
        )


def predictions_dir(output) -> Path | None:
    """`--output results.json` puts each benchmark's predictions in `results.predictions/<name>.jsonl`: named
    after the results file, so two evaluations written to one folder keep their own (a shared `predictions/`
    was overwritten by the next one, unannounced)."""
    if not output:
        return None
    output = Path(output).resolve()
    return output.with_name(output.stem + ".predictions")


def _write_report(report: dict, output, console) -> None:
    if output:
        from leap_finetune.files import write_atomic

        Path(output).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(output), json.dumps(report, indent=2))
        console.print(f"results: {output}")
        predictions = predictions_dir(output)
        if predictions.is_dir():
            console.print(f"predictions (prompt, prediction, reference, score per row): {predictions}/")


def _evaluate_retrieval(resolved: ResolvedConfig, target: TrainedModel, benchmarks, console) -> dict:
    """nDCG@10 (the score), MRR@10 and recall@1/@10 of a saved sentence-transformers / ColBERT model (or any
    encoder given as model_name: the recipe's model, pooling and prompts) on each retrieval benchmark."""
    import time

    from leap_finetune.evaluation.retrieval_benchmark import evaluator, scores
    from leap_finetune.evaluation.runner import print_summary
    from leap_finetune.quiet import quiet_libraries

    if target.adapter_dir is not None:
        raise LeapError(
            "a retrieval run's adapter folder is evaluated through its merged model",
            where=f"checkpoint: {target.adapter_dir}",
            fix="point checkpoint at the run folder or its model/",
        )
    if unmerged_lora(Path(target.model_id)):  # (loaded as a plain model, its layers would start fresh)
        raise LeapError(
            "this is a checkpoint of a LoRA retrieval run (its layers hold the adapter unmerged)",
            where=f"checkpoint: {target.model_id}",
            fix="evaluate the finished run (its model/ folder holds the merged model), or resume the run to finish it",
        )
    quiet_libraries()
    multi_vector = method_of(resolved).multi_vector
    import tempfile

    from leap_finetune.models.encoders import build_encoder

    # (a built-in tiny backbone is saved to run_dir first: a temporary one here)
    with tempfile.TemporaryDirectory() as scratch:
        model = build_encoder(resolved.model_copy(update={"model_id": target.model_id, "run_dir": scratch}), console)
    results: dict[str, float] = {}
    for bench in benchmarks:
        data = bench.items
        start = time.perf_counter()
        name = f"benchmark_{data.name}"
        found = scores(evaluator(data, resolved.retrieval.prompts, multi_vector=multi_vector)(model), name)
        results[f"benchmark/{data.name}/score"] = found["ndcg@10"]
        results.update({f"benchmark/{data.name}/{k}": v for k, v in found.items() if k != "ndcg@10"})
        results[f"benchmark/{data.name}/queries"] = data.scored_queries
        results[f"benchmark/{data.name}/documents"] = len(data.corpus)
        results[f"benchmark/{data.name}/seconds"] = time.perf_counter() - start
    for bench in benchmarks:
        unscored = len(bench.items.queries) - bench.items.scored_queries
        if unscored:
            console.print(
                f"note: benchmark '{bench.name}': {unscored} of {len(bench.items.queries)} queries have no "
                "relevant document (in qrels or their `relevant` list) and are not scored"
            )
    print_summary(console, results, None, f"of {target.name} (score: nDCG@10)")
    return {"model": target.model_id, "results": results}


def _check_output(output: Path, resolved: ResolvedConfig) -> None:
    """The results file must not be a folder or one of the run's inputs (checked before evaluating)."""
    output = output.resolve()
    if output.is_dir():
        raise LeapError("--output is a folder", where=str(output), fix="give a file path, e.g. results.json")
    inputs = [resolved.config_path, *(b.path for b in resolved.evals.benchmarks)]
    if str(output) in {str(Path(p).resolve()) for p in inputs if p}:
        raise LeapError(
            "--output would overwrite an input of this evaluation (the config or a benchmark file)",
            where=str(output),
            fix="give another file path, e.g. results.json",
        )
    from leap_finetune.files import check_writable

    check_writable(output.parent, "--output")


def _processor_for(model_id: str, base_model_id: str, tokenizer, benchmarks):
    """A vision-language model's processor when some benchmark row has images, else None. A
    training checkpoint holds no processor files: fine-tuning does not change image preprocessing,
    so the base model's processor is used."""
    from leap_finetune.evaluation.runner import has_images
    from leap_finetune.models.vision import (
        has_processor_files,
        is_vision_model,
        load_processor,
    )

    if not (is_vision_model(model_id) and has_images(benchmarks)):
        return None
    return load_processor(model_id if has_processor_files(model_id) else base_model_id, tokenizer)


def add_run_unseen_tools(resolved: ResolvedConfig, console: Console) -> None:
    """A config with dataset.hold_out_tools scores its run's `unseen_tools` benchmark too: the rows the run held out
    are in the run folder (prepared/unseen_tools.jsonl) of `checkpoint` (a run, or a folder in one)."""
    from leap_finetune.data.held_out_tools import UNSEEN_TOOLS_BENCHMARK

    items = resolved.dataset if isinstance(resolved.dataset, list) else [resolved.dataset]
    if not any(item is not None and item.hold_out_tools for item in items):
        return
    if resolved.evals is not None and (
        not resolved.evals.benchmarks  # (`evals.benchmarks: []` turns benchmarks off, this one too)
        or any(b.name == UNSEEN_TOOLS_BENCHMARK for b in resolved.evals.benchmarks)
    ):
        return
    checkpoint = Path(resolved.checkpoint) if resolved.checkpoint else None
    folders = [checkpoint] if checkpoint else []
    if checkpoint is not None and checkpoint.is_dir():  # the model chosen in it (a project folder: its newest run)
        target = model_to_evaluate(resolved)
        chosen = target.adapter_dir or Path(target.model_id)
        folders += [chosen, chosen.parent, chosen.parent.parent]
    found = next((RunFolder(f).unseen_tools for f in folders if RunFolder(f).unseen_tools.is_file()), None)
    if found is None:
        console.print(
            f"[yellow]note: benchmark '{UNSEEN_TOOLS_BENCHMARK}' (dataset.hold_out_tools) is not scored: its rows are "
            "in the run folder of a trained run (prepared/unseen_tools.jsonl), and "
            + (f"checkpoint {checkpoint} is not in one" if checkpoint else "no checkpoint: is set")
            + "; set checkpoint: to the run folder[/yellow]"
        )
        return
    from leap_finetune.config.schema_evals import BenchmarkConfig, EvalsConfig

    bench = BenchmarkConfig(name=UNSEEN_TOOLS_BENCHMARK, path=str(found), metric="tool_call")
    if resolved.evals is None:
        resolved.evals = EvalsConfig(benchmarks=[bench])
    else:
        resolved.evals = resolved.evals.model_copy(update={"benchmarks": [*resolved.evals.benchmarks, bench]})


def model_to_evaluate(resolved: ResolvedConfig) -> TrainedModel:
    """`checkpoint:` a run folder (its final model, else its newest complete checkpoint), a checkpoint
    folder, an adapter folder (over the base model its run trained, else model_name) or a GGUF file; without
    `checkpoint`, model_name."""
    if not resolved.checkpoint:
        return TrainedModel(resolved.model_id)
    folder = Path(resolved.checkpoint)
    if folder.suffix.lower() == ".gguf" and folder.is_file():
        return TrainedModel(str(folder.parent), gguf_file=folder)
    if not folder.is_dir():
        raise LeapError(
            "not a folder" if folder.exists() else "no such file or folder",
            where=f"checkpoint: {folder}",
            fix="point checkpoint at a run folder, a checkpoint-N folder, an adapter folder or a .gguf file",
        )
    trained = trained_in(folder, base=resolved.model_id)
    if trained is None:
        raise LeapError(
            "no model in this folder (no config.json, no adapter_config.json, no model/, no complete checkpoint)",
            where=f"checkpoint: {folder}",
            fix="point checkpoint at a run folder, a checkpoint-N folder or an adapter folder",
        )
    return trained
