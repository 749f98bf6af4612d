"""What the driver prints: the resolved config, the data report, start and end summaries."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from leap_finetune.config.quantization import lora_name
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.data.prepared import PreparedData
from leap_finetune.data.row_kinds import row_kind_of, tokens_line
from leap_finetune.data.tool_use import WARNINGS
from leap_finetune.launch.facts import RunFacts, micro_batch
from leap_finetune.launch.steps import accumulation
from leap_finetune.methods import method_of
from leap_finetune.runs.folder import RunFolder

# Above this share of invalid rows skipped by `on_invalid: skip`, the data report warns loudly.
SKIPPED_SHARE_WARNING = 0.10


def config_table(resolved: ResolvedConfig) -> Table:
    t = resolved.training
    table = Table(title="resolved config", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("model", f"{resolved.model_id} (family {resolved.model_family})"),
        ("chat template", resolved.chat_template),
        ("training", f"{resolved.training_type}, loss on {resolved.loss_on} tokens"),
        (
            "fine-tune",
            f"{lora_name(t)} r={resolved.peft['r']} alpha={resolved.peft['lora_alpha']}" if resolved.peft else "full",
        ),
        ("dataset", _datasets(resolved)),
        ("learning rate", str(t.get("learning_rate"))),
        ("epochs / max steps", f"{t.get('num_train_epochs')} / {t.get('max_steps', -1)}"),
        ("batch x accumulation", f"{micro_batch(t)} x {accumulation(t)}"),
        ("max length / packing", f"{t.get('max_length')} / {t.get('packing', False)}"),
    ]
    if resolved.vision:  # (launch is above validate: the words of validate/vision.py)
        from leap_finetune.validate.vision import trained_parts

        rows.insert(4, ("trains", "\n".join(f"{part}: {how}" for part, how in trained_parts(t, resolved.peft))))
        if resolved.image_processor is not None and resolved.image_processor.settings():
            settings = resolved.image_processor.settings()
            rows.insert(5, ("images", ", ".join(f"{k} {v}" for k, v in settings.items())))
    if method_of(resolved).rewards:
        rows[2] = ("training", "grpo, rewards: " + ", ".join(_reward_names(resolved)))
        rows[8] = (
            "generations / length",
            f"{t.get('num_generations')} per prompt / up to {t.get('max_completion_length')} tokens",
        )
        from leap_finetune.rl.engines import rollout_advice

        engine = rollout_engine(resolved)
        rows.append(
            (
                "rollouts",
                engine
                + "\n"
                + rollout_advice(
                    resolved.model_id,
                    engine=engine,
                    lora=resolved.peft is not None,
                    vllm_mode=str(t.get("vllm_mode", "colocate")),
                ),
            )
        )
        if resolved.environment is not None:
            rows.append(("environment", _environment_line(resolved.environment)))
    if resolved.retrieval is not None:  # embedding / colbert: no chat template, no loss mask, lengths per side
        r = resolved.retrieval
        rows[1] = (
            "prompts",
            f"query {r.prompts.query!r}, document {r.prompts.document!r}"
            if (r.prompts.query or r.prompts.document)
            else "none",
        )
        loss = {
            "mnrl": "in-batch negatives",
            "cached_mnrl": f"in-batch negatives, cached (mini-batches of {r.mini_batch_size})",
        }[r.loss]
        rows[2] = ("training", f"{resolved.training_type}, {loss}, pooling {r.pooling}")
        rows[8] = ("max length query / document", f"{r.query_max_length} / {r.document_max_length}")
    if resolved.evals:
        rows.append(
            ("benchmarks", ", ".join(f"{b.name} ({b.metric.rsplit('::', 1)[-1]})" for b in resolved.evals.benchmarks))
        )
    for key, value in rows:
        table.add_row(key, value)
    return table


def rollout_engine(resolved: ResolvedConfig) -> str:
    """Which engine generates GRPO's rollouts, as the config says (the run prints the one it uses)."""
    from leap_finetune.models.vision import is_vision_model
    from leap_finetune.rl.sampler import why_not_config

    t = resolved.training
    if t.get("use_vllm"):
        return f"vLLM, {t.get('vllm_mode')}"
    if t.get("use_transformers_paged") or t.get("use_transformers_continuous_batching"):
        return "transformers' generation (continuous batching)"
    if t.get("fsdp"):
        return "transformers' generation (FSDP: generate gathers the sharded weights)"
    why = why_not_config(t, vision=is_vision_model(resolved.model_id))
    return "leap-finetune sampler (CUDA graphs on a GPU)" if why is None else f"transformers' generation ({why})"


def _reward_names(resolved: ResolvedConfig) -> list[str]:
    from leap_finetune.rl.rewards import reward_name

    names = [reward_name(spec) for spec in resolved.rewards.funcs]
    if resolved.rewards.judge is not None:
        names.append(f"judge ({resolved.rewards.judge.model})")
    weights = resolved.rewards.weights
    return [f"{n} x{w:g}" for n, w in zip(names, weights)] if weights else names


def _datasets(resolved: ResolvedConfig) -> str:
    if resolved.dataset is None:
        return "-"
    from leap_finetune.data.prepared import dataset_items

    return "\n".join(d.path + (f"  (eval: {d.val_path})" if d.val_path else "") for d in dataset_items(resolved))


def data_report(
    console: Console, prepared: PreparedData, resolved: ResolvedConfig | None = None, max_listed: int = 5
) -> None:
    row_kind = row_kind_of(resolved) if resolved is not None else None  # (what the rows' kind says of them)
    console.print(row_kind.data_line(prepared) if row_kind is not None else tokens_line(prepared))
    with_images, images, image_tokens = prepared.train.images()
    if images:
        console.print(
            f"data: {images:,} training images in {with_images:,} rows, {image_tokens:,} image tokens "
            f"({image_tokens / images:,.0f} per image; counted in the train tokens, never trained)"
        )
    if len(prepared.sources) > 1:
        _sources_table(console, prepared)
    if prepared.tool_split:
        _tool_table(console, prepared, resolved)
    if prepared.from_cache:
        console.print(
            f"data: prepared rows read from the cache ({escape(prepared.from_cache)}); nothing changed since "
            "they were prepared"
        )
    elif prepared.seconds >= 1:
        rows = len(prepared.train) + len(prepared.eval)
        console.print(f"data: prepared in {prepared.seconds:.1f} s ({rows / prepared.seconds:,.0f} rows/s)")
    by_kind: dict[str, list] = {}
    for warning in prepared.warnings:
        by_kind.setdefault(warning.kind, []).append(warning)
    for kind, items in by_kind.items():
        rows = prepared.warning_rows.get(kind) or len({(w.file, w.location) for w in items})
        examples = ", ".join(f"{w.location} ({w.field})" for w in items[:3])
        label, colour = ("note", "dim") if kind == "converted_tool_calls" else ("warning", "yellow")
        console.print(
            f"[{colour}]{label} ({kind}): {escape(WARNINGS[kind])}: {rows} row(s), "
            f"e.g. {escape(items[0].file)} {escape(examples)}[/{colour}]"
        )
    for advice in row_kind.data_warnings(prepared, resolved) if row_kind is not None else ():
        console.print(f"[yellow]warning: {escape(advice)}[/yellow]")
    for notice in prepared.notices:
        console.print(f"[yellow]note: {escape(notice)}[/yellow]")
    if resolved is not None:  # (settings that do nothing in this run: validate/no_effect.py)
        from leap_finetune.validate.no_effect import data_notes

        for note in [*resolved.config_notes, *data_notes(resolved, prepared)]:
            console.print(f"[yellow]note: {escape(note)}[/yellow]")
    if prepared.invalid_skipped:
        share = prepared.invalid_skipped / max(1, prepared.rows_read)
        if share > SKIPPED_SHARE_WARNING:
            console.print(
                f"[bold red]warning: {share:.0%} of the rows ({prepared.invalid_skipped} of "
                f"{prepared.rows_read}) are invalid and skipped: is this the right data, and the right "
                "training_type? (dataset.on_invalid: error lists every problem)[/bold red]"
            )
        console.print(f"[yellow]skipped {prepared.invalid_skipped} invalid row(s) (dataset.on_invalid: skip):[/yellow]")
        for row in prepared.dropped[:max_listed]:
            if "max_length" not in row.reason:
                console.print(f"  - {row.file}, {row.location}: {row.reason}", markup=False)
    if prepared.fully_truncated:
        console.print(
            f"[yellow]dropped {prepared.fully_truncated} row(s) whose assistant tokens are all beyond max_length "
            "(raise training_config.max_length to keep them):[/yellow]"
        )
        for row in [r for r in prepared.dropped if "max_length" in r.reason][:max_listed]:
            console.print(f"  - {row.file}, {row.location}: {row.reason}", markup=False)
    if prepared.partially_truncated:
        console.print(
            f"[yellow]{prepared.partially_truncated} row(s) lose some trained tokens to max_length truncation[/yellow]"
        )


def _sources_table(console: Console, prepared: PreparedData) -> None:
    """Several `dataset:` sources: each one's rows read, valid, split, mixed and used."""
    table = Table(title="data sources", title_justify="left")
    for column in ("source", "read", "valid", "train", "eval", "mix", "used", "used tokens"):
        table.add_column(column, justify="left" if column in ("source", "mix") else "right")
    for s in prepared.sources:
        held_out = f" + {s.val_rows_read:,} held out" if s.val_path else ""  # (val_path's rows, read apart)
        table.add_row(
            escape("/".join(s.path.split("/")[-2:])),
            f"{s.rows_read:,}{held_out}",
            f"{s.valid:,}",
            f"{s.train_rows:,}",
            f"{s.eval_rows:,}",
            s.mixing or "-",
            f"{s.used_rows:,}",
            f"{s.train_tokens:,}",
        )
    console.print(table)


def _tool_table(console: Console, prepared: PreparedData, resolved: ResolvedConfig | None, shown: int = 30) -> None:
    """dataset.hold_out_tools: the rows naming each tool in each split, and where the held-out ones went (the held-out
    tools first, then the most named; at most `shown` lines)."""
    from leap_finetune.data.held_out_tools import UNSEEN_TOOLS_BENCHMARK, held_out_names
    from leap_finetune.data.prepared import dataset_items

    held_out = held_out_names(dataset_items(resolved)) if resolved is not None and resolved.dataset else frozenset()
    table = Table(title="tools (rows naming each: calls or definitions)", title_justify="left")
    for column in ("tool", "train", "eval", "held out"):
        table.add_column(column, justify="left" if column == "tool" else "right")
    order = sorted(prepared.tool_split.items(), key=lambda kv: (kv[0] not in held_out, -sum(kv[1].values()), kv[0]))
    for name, counts in order[:shown]:
        held = counts["held_out"]
        table.add_row(
            escape(name) + (" (held out)" if name in held_out else ""),
            f"{counts['train']:,}",
            f"{counts['eval']:,}",
            f"{held:,}" if held else "-",
        )
    if len(order) > shown:
        table.add_row(f"... and {len(order) - shown:,} more tools", "", "", "")
    console.print(table)
    scored = resolved is None or resolved.evals is None or bool(resolved.evals.benchmarks)
    console.print(
        f"data: {prepared.tool_held_rows:,} row(s) naming a held-out tool are not trained on; their "
        f"{len(prepared.unseen_tool_rows):,} turn(s) calling one "
        + (
            f"are the benchmark '{UNSEEN_TOOLS_BENCHMARK}' (metric tool_call)"
            if scored
            else f"would be the benchmark '{UNSEEN_TOOLS_BENCHMARK}' (not scored: evals.benchmarks is [])"
        )
    )


def _last_logged(run_dir: Path, keys: tuple[str, ...], *, first: bool = False) -> dict:
    """The last (or first) value of each key in metrics.jsonl (training logs)."""
    from leap_finetune.files import read_metrics

    found: dict = {}
    for record in read_metrics(RunFolder(run_dir).metrics):
        seen = {k: record[k] for k in keys if isinstance(record.get(k), (int, float))}
        found.update({k: v for k, v in seen.items() if not (first and k in found)})
    return found


def _environment_line(environment: dict) -> str:
    """The tools an episode is shown, where they come from, and the episode's limits."""
    source = environment["source"]
    where = source["file"] if source["kind"] == "http" else Path(source["file"]).name
    where += f"::{source['name']}" if source.get("name") else ""
    names = ", ".join(s["name"] for s in environment["schemas"])
    return (
        f"{len(environment['schemas'])} tool(s) ({names}) from {where}; up to {environment['max_turns']} turns, "
        f"{environment['tool_timeout']:g} s per call"
        + ("; tools renamed per episode" if environment.get("augment_tools") else "")
    )


EPISODE_KEYS = (
    "episodes/success",
    "episodes/calls",
    "episodes/turns",
    "episodes/tool_error_rate",
    "eval_episodes/success",
)


def _episodes_line(run_dir: Path) -> str | None:
    """GRPO with an environment: success first -> last log, and the last log's calls, turns and failed calls."""
    first, last = _last_logged(run_dir, EPISODE_KEYS, first=True), _last_logged(run_dir, EPISODE_KEYS)
    if "episodes/calls" not in last:
        return None
    success = (
        f"success {first['episodes/success']:.2f} -> {last['episodes/success']:.2f}, "
        if "episodes/success" in last
        else ""
    )
    held_out = (
        f"; held out: success {first['eval_episodes/success']:.2f} -> {last['eval_episodes/success']:.2f}"
        if "eval_episodes/success" in last
        else ""
    )
    return (
        f"{success}{last['episodes/calls']:.2f} calls and {last['episodes/turns']:.2f} turns per episode, "
        f"{last['episodes/tool_error_rate']:.0%} of calls failed (first -> last log){held_out}"
    )


def _trained_line(resolved: ResolvedConfig) -> str:
    method = f"{lora_name(resolved.training)} r={resolved.peft.get('r')}" if resolved.peft else "full fine-tune"
    teacher = f", from teacher {resolved.distill['teacher']} ({resolved.distill['loss']})" if resolved.distill else ""
    continued = f", continuing the adapter {resolved.adapter_path}" if resolved.adapter_path else ""
    return f"{resolved.training_type.upper()} of {resolved.model_name}, {method}{teacher}{continued}"


def end_report(console: Console, resolved: ResolvedConfig, summary: dict) -> None:
    """The run's end: one line (steps, loss or reward, held-out results), then - unless it stopped early - the run
    in one table: what trained, how long and how fast, the results before -> after, where it all is."""
    _done_line(console, summary)
    if summary.get("stopped_early"):
        return
    from leap_finetune.launch.reports.model_card import _best_eval, retrieval_results

    run_dir = Path(summary["run_dir"])
    table = Table(title="run report", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # (paths wrap whole, never cut with an ellipsis)
    table.add_row("trained", _trained_line(resolved))
    seconds = summary.get("train_runtime_s")
    tokens = summary.get("tokens_seen")
    if seconds:
        speed = f", {tokens / seconds:,.0f} tokens/s" if tokens else ""
        table.add_row("steps / time", f"{summary['global_step']} steps in {seconds:,.1f} s{speed}")
    if summary.get("gradient_all_reduce"):  # (several workers: as DDP reported it, config/communication.py)
        table.add_row("gradient all-reduce", summary["gradient_all_reduce"])
    if summary.get("peak_gpu_memory_gib") is not None:
        from leap_finetune.recipes.summary import gpu_memory_text

        table.add_row("GPU memory", gpu_memory_text(summary))
    if summary.get("eval_loss") is not None:
        before = summary.get("initial_eval_loss")
        text = (f"{_four(before)} -> " if before is not None else "") + _four(summary["eval_loss"])
        best = _best_eval(run_dir)
        if best:
            text += f" (best {best[0]:.4f} at step {best[1]})"
        table.add_row("eval loss", text)
    for key, after in (summary.get("benchmarks") or {}).items():
        before = (summary.get("initial_benchmarks") or {}).get(key)
        table.add_row(key, (f"{before:.3f} -> " if before is not None else "") + f"{after:.3f}")
    for name, before, after in retrieval_results(summary):  # embedding / colbert
        table.add_row(name, (f"{before:.3f} -> " if before is not None else "") + f"{after:.3f}")
    after, before = summary.get("eval_metrics") or {}, summary.get("initial_eval_metrics") or {}
    trained = _last_logged(run_dir, ("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected"))
    for name, value in row_kind_of(resolved).results(after, before, trained):  # (the reward rows of preference data)
        table.add_row(name, value)
    if resolved.qat:
        target = resolved.qat["target"]
        table.add_row("trained for", f"{target}: export with --gguf {target} (qat:)")
    experts = _last_logged(run_dir, ("moe/aux_loss", "moe/expert_load_min", "moe/expert_load_max"))
    if len(experts) == 3:  # (a mixture of experts: its routers at the last log, models/moe_router.py)
        table.add_row(
            "experts (last log)",
            f"load {experts['moe/expert_load_min']:.2f}-{experts['moe/expert_load_max']:.2f} x the even share, "
            f"balance loss {experts['moe/aux_loss']:.3f} (1.0 = even)",
        )
    if summary.get("final_reward") is not None:
        table.add_row(
            "reward (first / last 5 steps)", f"{summary['initial_reward']:.3f} -> {summary['final_reward']:.3f}"
        )
    episodes = _episodes_line(run_dir) if resolved.environment else None
    if episodes:
        table.add_row("episodes", episodes)
    if summary.get("rollouts"):
        rollouts = summary["rollouts"]
        table.add_row(
            "rollouts",
            rollouts["engine"] + (f" ({rollouts['why_not_sampler']})" if rollouts.get("why_not_sampler") else ""),
        )
    judge = summary.get("judge")
    if judge and judge.get("requests"):
        text = f"{judge['failures']:,} of {judge['requests']:,} requests failed" + (
            f" since the resume at step {judge['since_step']}" if judge.get("since_step") else ""
        )
        if judge["failures"] and judge.get("last_failure"):
            text += f" (scored failure_score; last: {judge['last_failure']})"
        table.add_row("judge", text)
    where = [f"run folder {run_dir}"]
    if summary.get("model_dir"):
        where.append(f"model {summary['model_dir']}")
    if summary.get("adapter_dir"):
        where.append(f"adapter {summary['adapter_dir']}")
    where.append("card README.md, plots/, train.log, metrics.jsonl")
    table.add_row("where", "\n".join(where))
    console.print(table)


def print_start(
    console: Console, resolved: ResolvedConfig, prepared: PreparedData, plan, devices, facts: RunFacts
) -> None:
    """What the run is about to do: its folder, rows, tokens and steps, the devices and the precision."""
    from leap_finetune.launch.rl_servers import judge_url

    epoch = facts.epoch
    steps = f"<= {facts.total_steps} (packing merges rows)" if facts.total_is_bound else facts.total_steps
    action = f"resuming from {plan.resume_checkpoint}" if plan.resume_checkpoint else "new run"
    rows = "prompts" if epoch.unit == "completions" else "rows"
    console.print(
        f"run: {plan.run_dir} ({action}); {len(prepared.train)} {rows}, {prepared.train_tokens:,} tokens, "
        f"{steps} steps of {facts.global_batch}" + (f" ({epoch.per_step_detail})" if epoch.approximate else "")
    )
    if epoch.last_batch:
        console.print(epoch.last_batch)
    console.print(facts.devices)
    if judge_url(resolved) and devices.use_gpu and not devices.judge:
        console.print(
            "[yellow]note: the judge runs on CPU (grpo_rollout.judge_gpus: 0): slow for a model of more "
            "than a few hundred million parameters; give it GPUs with judge_gpus: 1[/yellow]"
        )
    console.print(f"device: {facts.device}, {facts.precision}")


def print_plan_notes(console: Console, plan) -> None:
    for note in plan.notes:
        console.print(f"[yellow]warning: {note}[/yellow]")
    if plan.changes:
        from leap_finetune.runs.checkpoints import step_of

        listed = "; ".join(
            f"{k.removeprefix('training_config.')}: {old!r} -> {new!r}" for k, (old, new) in plan.changes.items()
        )
        console.print(
            f"resume: from step {step_of(plan.resume_checkpoint)} on, {listed} (resume_allow_changes; "
            "recorded in resume_changes.json)"
        )
    if plan.finished is not None:
        console.print(
            f"[green]already finished[/green]: {plan.run_dir} ended at step {plan.finished['global_step']} "
            f"with these settings; nothing to train (model: {plan.finished['model_dir']}). To train "
            "longer, raise max_steps or num_train_epochs; to start again, remove resume_from_checkpoint."
        )


def _done_line(console: Console, summary: dict) -> None:
    if summary.get("stopped_early"):
        console.print(
            f"[yellow]stopped at step {summary['global_step']} (checkpoint saved); continue with "
            "training_config.resume_from_checkpoint: latest[/yellow]"
        )
        return
    parts = [f"done: {summary['global_step']} steps"]
    if summary.get("final_reward") is not None:
        parts.append(f"reward {summary['initial_reward']:.2f} -> {summary['final_reward']:.2f} (first / last 5 steps)")
        judge = summary.get("judge") or {}
        if judge.get("failures"):
            parts.append(f"judge failures {judge['failures']:,} of {judge['requests']:,}")
    elif summary.get("train_loss") is not None:
        parts.append(f"train loss {summary['train_loss']:.4f}")
    if summary.get("eval_loss") is not None:
        before = summary.get("initial_eval_loss")
        parts.append(
            f"eval loss {before:.4f} -> {summary['eval_loss']:.4f}"
            if before is not None
            else f"eval loss {summary['eval_loss']:.4f}"
        )
    if summary.get("ndcg@10") is not None:  # embedding / colbert: held-out retrieval
        before = summary.get("initial_ndcg@10")
        parts.append(
            f"held-out nDCG@10 {before:.2f} -> {summary['ndcg@10']:.2f}"
            if before is not None
            else f"held-out nDCG@10 {summary['ndcg@10']:.2f}"
        )
    for name, after in (summary.get("retrieval_benchmarks") or {}).items():
        before = (summary.get("initial_retrieval_benchmarks") or {}).get(name)
        parts.append(
            f"{name} nDCG@10 {before:.2f} -> {after:.2f}" if before is not None else f"{name} nDCG@10 {after:.2f}"
        )
    console.print(", ".join(parts))
    console.print(
        f"model: {summary['model_dir']}"
        + (f"  adapter: {summary['adapter_dir']}" if summary.get("adapter_dir") else "")
    )


def _four(value: float) -> str:
    """Four decimals, without a minus on a value that rounds to zero (a divergence of -1e-7 is 0.0000)."""
    return f"{round(float(value), 4) + 0.0:.4f}"
