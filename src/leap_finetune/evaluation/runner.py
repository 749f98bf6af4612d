"""Running the `evals:` block: every benchmark, scores logged as benchmark/{name}/score, the last
evaluation's predictions saved per benchmark, a summary table printed."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from leap_finetune.config.schema_evals import EvalsConfig
from leap_finetune.data.render import Renderer
from leap_finetune.evaluation.metrics import check_custom_metric, load_metric
from leap_finetune.evaluation.rows import BenchmarkItem, is_logprob, load_benchmark


def warn(text: str) -> None:
    import sys

    print(f"warning: {text}", file=sys.stderr, flush=True)


@dataclass
class LoadedBenchmark:
    name: str
    metric: str
    items: list[BenchmarkItem]
    tool_call_order: str = "set"  # (metric tool_call)
    environment: dict | None = None  # (metric episodes: the config's environment)


def has_images(benchmarks: list[LoadedBenchmark]) -> bool:
    return any(item.images for bench in benchmarks for item in bench.items)


def load_benchmarks(
    evals: EvalsConfig, *, vision: bool, model_name: str, environment: dict | None = None
) -> list[LoadedBenchmark]:
    """Validate every benchmark row (and custom metric) before any model loads. `environment`: the config's, which
    plays the rows of metric episodes."""
    loaded = []
    for bench in evals.benchmarks:
        if bench.metric == "retrieval":  # embedding / colbert: scored by sentence-transformers' evaluators
            from leap_finetune.evaluation.retrieval_benchmark import load_retrieval_benchmark

            loaded.append(LoadedBenchmark(bench.name, bench.metric, load_retrieval_benchmark(bench)))
            continue
        items = load_benchmark(bench, vision=vision, model_name=model_name)
        if "::" in bench.metric:  # a custom metric that cannot import or fails on its own references fails now
            check_custom_metric(bench.metric, bench.name, items)
        loaded.append(LoadedBenchmark(bench.name, bench.metric, items, bench.tool_call_order or "set", environment))
    return loaded


def run_benchmarks(
    model,
    renderer: Renderer | None,
    evals: EvalsConfig,
    benchmarks: list[LoadedBenchmark],
    *,
    predictions_dir: Path | None = None,
    processor=None,
    server=None,
) -> dict[str, float]:
    """Evaluate every benchmark; returns flat metrics: benchmark/{name}/score and extras.
    `processor`: a vision-language model's, for rows with images. `server` (evaluation/server.py): generation
    benchmarks are answered by it; `model` is then only needed for log-prob benchmarks (None without them)."""
    import torch

    was_training = model.training if model is not None else False
    if model is not None:
        model.eval()
    results: dict[str, float] = {}
    # Layers compiled for training shapes (recipes/speed.py) would recompile for every decoding shape.
    stance = torch.compiler.set_stance("force_eager")
    stance.__enter__()
    try:
        for bench in benchmarks:
            start = time.perf_counter()
            if is_logprob(bench.metric):
                metrics, predictions = _logprob(model, renderer, evals, bench, processor)
            elif bench.metric == "episodes":
                from leap_finetune.evaluation.episodes_benchmark import run_episode_benchmark

                metrics, predictions = run_episode_benchmark(model, renderer, evals, bench, bench.environment)
            else:
                metrics, predictions = _generation(model, renderer, evals, bench, processor, server)
            metrics["seconds"] = time.perf_counter() - start
            results.update({f"benchmark/{bench.name}/{key}": value for key, value in metrics.items()})
            if predictions_dir is not None:
                predictions_dir.mkdir(parents=True, exist_ok=True)
                path = predictions_dir / f"{bench.name}.jsonl"
                path.write_text(
                    "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions), encoding="utf-8"
                )
    finally:
        stance.__exit__(None, None, None)
        if was_training:
            model.train()
    return results


def _generation(model, renderer, evals, bench, processor=None, server=None):
    from leap_finetune.data.render import split_thinking

    metric = load_metric(bench.metric)
    if server is not None:  # the server applies the model's chat template to the messages
        prompts = [item.prompt for item in bench.items]
        outputs = server.generate(bench.name, bench.items, evals, tool_calls=bench.metric == "tool_call")
    else:
        from leap_finetune.evaluation.generation import generate  # (torch: only where a model generates)

        prompts = [renderer.prompt_text(item.prompt, item.tools) for item in bench.items]
        outputs = generate(
            model,
            renderer.tokenizer,
            prompts,
            max_new_tokens=evals.max_new_tokens,
            batch_size=evals.batch_size,
            do_sample=evals.do_sample,
            temperature=evals.temperature,
            top_p=evals.top_p,
            images=[item.images for item in bench.items],
            processor=processor,
        )
    if bench.metric == "tool_call":
        return _tool_calls(bench, prompts, outputs)
    scores, unparsed, predictions, thought = [], 0, [], 0
    errors = getattr(metric, "errors", None)  # a custom metric's exceptions (scored 0), counted, not hidden
    for item, prompt, output in zip(bench.items, prompts, outputs, strict=True):
        raised = len(errors) if errors is not None else 0
        answer, thinking = split_thinking(output)  # (a reasoning model's <think> block is not its answer)
        thought += thinking is not None
        score, parsed = metric(answer, split_thinking(item.reference)[0], item)
        unparsed += not parsed
        scores.append(score)
        predictions.append(
            {
                "source": f"{item.file}, {item.location}",
                "prompt": prompt,
                "prediction": answer,
                "reference": item.reference,
                "score": score,
            }
        )
        if thinking is not None:
            predictions[-1]["thinking"] = thinking
        if errors is not None and len(errors) > raised:
            predictions[-1]["metric_error"] = errors[-1]
    metrics = {"score": sum(scores) / len(scores), "unparsed": unparsed, "rows": len(scores)}
    if thought:  # (a reasoning model's: how many answers came with a <think> block, taken out before scoring)
        metrics["thinking"] = thought
    if errors is not None:
        metrics["metric_errors"] = len(errors)
        if errors:
            warn(
                f"custom metric of benchmark '{bench.name}' raised on {len(errors)} of {len(scores)} row(s) "
                f"(scored 0), e.g. {errors[0]}"
            )
    return metrics, predictions


def _tool_calls(bench, prompts, outputs):
    """metric tool_call: the score is the exact-call accuracy; the sub-scores (data/tool_call_score.py) are
    logged beside it (benchmark/{name}/parsed, name, argument_f1, no_call) and kept per row in the predictions."""
    from dataclasses import asdict

    from leap_finetune.data.tool_call_score import aggregate, score_turn

    scored, predictions = [], []
    served = outputs and not isinstance(outputs[0], str)  # (eval --server: ServedTurns)
    for item, prompt, output in zip(bench.items, prompts, outputs, strict=True):
        if served:
            found, extra = _served_score(output, item, bench.tool_call_order)
            text = output.content
        else:
            found, extra, text = score_turn(output, item.reference_calls or [], order=bench.tool_call_order), {}, output
        scored.append(found)
        predictions.append(
            {
                "source": f"{item.file}, {item.location}",
                "prompt": prompt,
                "prediction": text,
                **extra,
                "reference": item.reference,
                "score": found.exact,
                **{k: v for k, v in asdict(found).items() if k != "exact" and v is not None},
            }
        )
    metrics = {"score": aggregate(scored)["exact"], **aggregate(scored)}
    metrics.update(unparsed=sum(not s.parsed for s in scored), rows=len(scored))
    if served:
        with_tools = [o for o in outputs if o.sent_tools]
        metrics["server_tool_calls"] = sum(o.calls is not None for o in outputs)  # answers with parsed tool_calls
        metrics["calls_in_text"] = sum("calls_in_text" in p for p in predictions)
        metrics["server_errors"] = sum(o.error is not None for o in outputs)
        _warn_served(bench.name, metrics, len(with_tools), len(outputs))
    return metrics, predictions


def _served_score(output, item, order: str):
    """A server's answer scored by the tool_calls its parser returned: calls it left in the text (its parser does not
    read the trained format, or was not asked to) count as no call, and are flagged."""
    from leap_finetune.data.tool_call_score import calls_in_text, score_calls, served_calls

    if output.error is not None:
        return score_calls([], f"the server failed: {output.error}", item.reference_calls or [], order=order), {
            "server_error": output.error
        }
    calls, problem = served_calls(output.calls)
    extra = {"tool_calls": [{"name": n, "arguments": a} for n, a in output.calls or []]}
    if not output.calls and calls_in_text(output.content):
        extra["calls_in_text"] = True
    return score_calls(calls, problem, item.reference_calls or [], order=order), extra


def _warn_served(name: str, metrics: dict, sent_tools: int, rows: int) -> None:
    if metrics["calls_in_text"]:
        warn(
            f"benchmark '{name}': the server returned tool calls as text in {metrics['calls_in_text']} of {rows} "
            "answer(s), not as tool_calls (scored as no call): its tool-call parser does not read them. vLLM: serve "
            "with --enable-auto-tool-choice --tool-call-parser lfm2; transformers serve: a model saved by "
            "leap-finetune carries the parser (tokenizer response_template); llama-server: --jinja"
            + ("" if sent_tools == rows else f"; {rows - sent_tools} row(s) have no `tools` column to send")
        )
    if metrics["server_errors"]:
        warn(
            f"benchmark '{name}': the server failed on {metrics['server_errors']} of {rows} answer(s) (scored 0; "
            "the reason is in each row's server_error in the predictions): often its tool-call parser failing on "
            "an answer"
        )


def _logprob(model, renderer, evals, bench, processor=None):
    from leap_finetune.evaluation.logprob import option_sequences, score_sequences  # (torch: only where scored)

    sequences, owners = [], []
    for index, item in enumerate(bench.items):
        for option_index, sequence in enumerate(option_sequences(renderer, item.prompt, item.options, item.images)):
            sequences.append(sequence)
            owners.append((index, option_index))
    pad = renderer.tokenizer.pad_token_id or 0
    logprobs = score_sequences(model, sequences, batch_size=evals.batch_size, pad_id=pad, processor=processor)
    per_item: list[list[tuple[float, int]]] = [[] for _ in bench.items]
    for (index, _), logprob, sequence in zip(owners, logprobs, sequences, strict=True):
        per_item[index].append((logprob, sequence.end - sequence.start))
    correct = {"sum": 0, "per_token": 0, "per_char": 0}
    predictions = []
    for item, scored in zip(bench.items, per_item, strict=True):
        picks = {
            "sum": max(range(len(scored)), key=lambda i: scored[i][0]),
            "per_token": max(range(len(scored)), key=lambda i: scored[i][0] / max(1, scored[i][1])),
            "per_char": max(range(len(scored)), key=lambda i: scored[i][0] / max(1, len(item.options[i]))),
        }
        for key, pick in picks.items():
            correct[key] += pick == item.answer_id
        predictions.append(
            {
                "source": f"{item.file}, {item.location}",
                "prompt": renderer.prompt_text(item.prompt),
                "prediction": item.options[picks["sum"]],
                "reference": item.options[item.answer_id],
                "score": float(picks["sum"] == item.answer_id),
                "option_logprobs": [round(lp, 4) for lp, _ in scored],
            }
        )
    rows = len(bench.items)
    return {
        "score": correct["sum"] / rows,
        "accuracy_per_token": correct["per_token"] / rows,
        "accuracy_per_char": correct["per_char"] / rows,
        "rows": rows,
    }, predictions


def print_summary(console, results: dict[str, float], step: int, when: str) -> None:
    from rich.table import Table

    names = sorted({key.split("/")[1] for key in results if key.startswith("benchmark/")})
    table = Table(title=f"benchmarks {when}" + (f" (step {step})" if step is not None else ""), title_justify="left")
    for column in ("benchmark", "score", "details"):
        table.add_column(column)
    for name in names:
        prefix = f"benchmark/{name}/"
        extras = ", ".join(
            f"{k[len(prefix) :]}={v:.3g}" for k, v in results.items() if k.startswith(prefix) and k != prefix + "score"
        )
        table.add_row(name, f"{results[prefix + 'score']:.4f}", extras)
    console.print(table)
