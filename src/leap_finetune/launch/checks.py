"""Everything `validate` and `run` check before anything is written, in one sequence (they check the same
things: what `validate` passes, `run` accepts). `plan` and `slurm` use its first steps: the rows, prepared and
tokenized, and the trainer's arguments built once.

Each step raises one LeapError that says where and how to fix it; nothing here writes to the run folder (the
prepared rows go to the data cache, for `run`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.data.prepare import prepare_data
from leap_finetune.data.prepared import PreparedData
from leap_finetune.errors import LeapError
from leap_finetune.evaluation.standalone import check_benchmarks
from leap_finetune.evaluation.trained_rows import trained_benchmark_notes
from leap_finetune.launch.devices import DevicePlan, device_plan, visible_gpus
from leap_finetune.launch.plan import RunPlan, check_resume_matches, plan_run
from leap_finetune.launch.run_folder import fingerprint
from leap_finetune.launch.steps import prepared_steps
from leap_finetune.methods import method_of
from leap_finetune.rl.custom_rewards import check_custom_rewards
from leap_finetune.rl.judge import check_judge_server
from leap_finetune.validate.grpo import check_generation_batch, check_rollout_engine
from leap_finetune.validate.loader import require_dataset


@dataclass
class CheckedRun:
    """A config that passed every check, with what the checks made: the rows, the run plan, the devices."""

    resolved: ResolvedConfig
    tokenizer: object
    renderer: object  # a Renderer (chat rows), or a RetrievalEncoder (embedding / colbert)
    prepared: PreparedData
    plan: RunPlan
    devices: DevicePlan


def check_run(resolved: ResolvedConfig, console: Console, outputs_root: str | Path | None = None) -> CheckedRun:
    """Every check of `validate` and `run`, in the order a user meets them: the rows, the trainer's arguments,
    the run folder and resume point, the rollout engine and judge, the custom rewards (called once on the
    first rows), the devices and batches, asynchronous evaluation, the resumed run's settings, the folder's lock."""
    if resolved.checkpoint:  # (eval's key: a run trains from model_name, and would silently ignore it)
        raise LeapError(
            "checkpoint: names the model `leap-finetune eval` scores; a run trains from model_name",
            where=f"{resolved.config_path or 'config'}: checkpoint",
            fix="to continue a run set training_config.resume_from_checkpoint: latest (or a checkpoint-N folder); "
            "to fine-tune a trained model further set model_name to its folder; to score it run "
            "`leap-finetune eval CONFIG` (checkpoint stays)",
        )
    tokenizer, renderer, prepared = prepare(resolved, console)
    check_solutions(resolved, prepared)
    check_training_arguments(resolved, has_eval=bool(prepared.eval), cuda=visible_gpus() > 0)
    plan = plan_run(resolved, outputs_root=Path(outputs_root) if outputs_root else None)
    add_unseen_tools_benchmark(resolved, prepared, plan.run_dir)
    check_rollout_engine(resolved)  # vLLM installed where use_vllm says so (plan does not need it)
    check_judge_server(resolved, console)  # an external judge answers (and serves its model)
    if plan.finished is None:  # (a finished run trains nothing: the user's code is not run for it)
        check_custom_rewards(resolved, prepared, tokenizer, console)
    devices = device_plan(resolved)
    check_fp8(resolved, devices, console)
    check_teacher_server(resolved, devices)
    check_generation_batch(resolved, devices.workers)
    # GRPO: prompts that fill no generation batch; batch_tokens: micro-batches that drop_last would all drop
    prepared_steps(resolved, prepared, devices)
    check_async_eval(resolved, devices)
    resolved = _memory_fit_of_the_run(resolved, plan)
    plan.changes = check_resume_matches(resolved, plan, fingerprint(prepared), devices.workers)
    check_run_folder_free(plan)
    return CheckedRun(resolved, tokenizer, renderer, prepared, plan, devices)


def check_fp8(resolved: ResolvedConfig, devices: DevicePlan, console: Console) -> None:
    """training_config.precision: fp8 on a base of float weights (not QLoRA's), on GPUs with FP8 matmuls (their
    compute capability from nvidia-smi: no CUDA context in the driver). On the CPU torch emulates the FP8 matmuls:
    allowed, with a note - the same rounding as on the GPU, to check a config at small scale."""
    if resolved.training.get("precision") != "fp8":
        return
    from leap_finetune.config.precision import fp8_device_problem, require_torchao
    from leap_finetune.config.quantization import is_quantized

    where = f"{resolved.config_path or 'config'}: training_config.precision"
    if is_quantized(resolved.training.get("model_init_kwargs")):
        raise LeapError(
            "training_config.precision: fp8 casts the base's weights to FP8 for each matmul, and the base is "
            "quantized to 4 or 8 bits (QLoRA)",
            where=where,
            fix="keep one: QLoRA for the least memory (peft_config extends DEFAULT_QLORA), or LoRA over the bf16 base "
            "(DEFAULT_LORA) with precision: fp8 for speed",
        )
    if getattr(resolved, "qat", None):
        raise LeapError(
            "training_config.precision: fp8 and qat both replace the linear layers' forward (QAT rounds the weights "
            "to the export's format, fp8 casts them for the matmul): QAT's would bypass the FP8 layers",
            where=where,
            fix="keep one: qat for a model that keeps its scores after quantized export, or precision: fp8 for speed",
        )
    require_torchao(where)
    if not devices.use_gpu:
        console.print(
            "note: training_config.precision fp8 on the CPU: torch emulates the FP8 matmuls (slower than float32, "
            "the same rounding as a GPU's); it is fast on GPUs of compute capability 8.9+ (H100, H200, L4, RTX 4090)",
            markup=False,
        )
        return
    problem = fp8_device_problem([c for c in map(_capability, devices.training) if c])
    if problem:
        raise LeapError(
            f"training_config.precision: fp8, and the run would train on {problem}",
            where=where,
            fix="remove precision (bf16), or run on a GPU with FP8 matmuls",
        )


def check_teacher_server(resolved: ResolvedConfig, devices: DevicePlan) -> None:
    """distill.teacher_gpus: the server the driver would start can start (vLLM, or leap-finetune's own server and its
    web stack) - found on the GPU machine, where the server exited at once without FastAPI (2026-12-06)."""
    from leap_finetune.launch.teacher_server import teacher_engine

    if not devices.teacher:
        return
    from leap_finetune.runs.processes import port_in_use

    port = resolved.distill.get("teacher_port", 8300)
    if port_in_use("127.0.0.1", port):
        raise LeapError(
            f"port {port} is in use by another process: the teacher server could not start there",
            where=f"{resolved.config_path or 'config'}: distill.teacher_port",
            fix="stop what listens there, or choose another teacher_port (or give that server as teacher_base_url "
            "if it serves the teacher)",
        )
    if teacher_engine(devices) == "vllm":
        return
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise LeapError(
            f"distill.teacher_gpus starts leap-finetune's own teacher server (vLLM is not installed), which needs "
            f"{', '.join(missing)}",
            where=f"{resolved.config_path or 'config'}: distill.teacher_gpus",
            fix="pip install 'leap-finetune[serve]' (or vllm)",
        )


def _capability(index: int) -> str | None:
    """nvidia-smi's compute_cap of GPU `index` (as the driver sees it), e.g. '9.0'; None where it cannot say."""
    import subprocess

    from leap_finetune.launch.devices import physical_ids

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", physical_ids([index])],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def check_solutions(resolved: ResolvedConfig, prepared: PreparedData) -> None:
    """GRPO's tool_call_match scores against each prompt's `solution`: data without any scores nothing."""
    from leap_finetune.data.chunks import matches_calls

    if matches_calls(resolved) and not any(prepared.train.column("solution")):
        where = dataset_items_path(resolved)
        raise LeapError(
            "the tool_call_match reward compares each completion's calls with the row's `solution`, and no training "
            "row has one",
            where=where,
            fix='give each row a `solution` (its reference turn: "<|tool_call_start|>[name(key=value)]'
            '<|tool_call_end|>", or text for a turn that should not call), or use messages rows whose last '
            "assistant turn is the reference",
        )


def dataset_items_path(resolved: ResolvedConfig) -> str:
    from leap_finetune.data.prepared import dataset_items

    return dataset_items(resolved)[0].path


def add_unseen_tools_benchmark(resolved: ResolvedConfig, prepared: PreparedData, run_dir: Path) -> None:
    """dataset.hold_out_tools: the held-out rows are benchmark `unseen_tools` (metric tool_call), scored with the
    run's other benchmarks (an `evals:` block with only it when the config has none). Its rows are written to the
    run folder's prepared/ with the other prepared rows (launch/run_folder.py)."""
    if not prepared.unseen_tool_rows or (resolved.evals is not None and not resolved.evals.benchmarks):
        return  # (`evals.benchmarks: []` turns benchmarks off for a run: this one too)
    from leap_finetune.config.schema_evals import BenchmarkConfig, EvalsConfig
    from leap_finetune.data.held_out_tools import UNSEEN_TOOLS_BENCHMARK
    from leap_finetune.runs.folder import RunFolder

    _check_unseen_rows(prepared.unseen_tool_rows, resolved)
    bench = BenchmarkConfig(name=UNSEEN_TOOLS_BENCHMARK, path=str(RunFolder(run_dir).unseen_tools), metric="tool_call")
    if resolved.evals is None:
        resolved.evals = EvalsConfig(benchmarks=[bench])
    else:
        resolved.evals = resolved.evals.model_copy(update={"benchmarks": [*resolved.evals.benchmarks, bench]})


def _check_unseen_rows(rows: list[dict], resolved: ResolvedConfig) -> None:
    """The unseen_tools rows read as the benchmark will read them (now, not at step 0): a problem names the training
    row it came from."""
    import json
    import tempfile

    from leap_finetune.config.schema_evals import BenchmarkConfig
    from leap_finetune.errors import DataError, RowProblem
    from leap_finetune.evaluation.rows import load_benchmark
    from leap_finetune.runs.folder import UNSEEN_TOOLS

    with tempfile.TemporaryDirectory(prefix="leap-unseen-") as folder:
        path = Path(folder) / UNSEEN_TOOLS
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        try:
            load_benchmark(
                BenchmarkConfig(name="unseen_tools", path=str(path), metric="tool_call"),
                vision=False,
                model_name=resolved.model_name,
            )
        except DataError as err:
            problems = [
                RowProblem(*rows[int(p.location.split()[-1]) - 1]["held_out_from"].rsplit(", ", 1), p.field, p.problem)
                for p in err.problems
            ]
            raise DataError(
                problems=problems,
                total_rows=len(rows),
                title="dataset.hold_out_tools benchmark",
                fix_text="these held-out rows do not make benchmark rows (the conversation up to a turn that calls a "
                "held-out tool): correct them, or remove them from the data",
            ) from None


def prepare(resolved: ResolvedConfig, console: Console | None = None, examples: int = 5, tokenizer=None):
    """(tokenizer, renderer, prepared rows): every row checked, rendered, masked and tokenized; the benchmarks'
    rows and LoRA's target modules checked too."""
    require_dataset(resolved)
    benchmarks = check_benchmarks(resolved)
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.data.render import Renderer
    from leap_finetune.models.loading import load_tokenizer

    init_kwargs = resolved.training.get("model_init_kwargs")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(resolved.model_id, init_kwargs)
    check_lora_targets(resolved, tokenizer, console)
    from leap_finetune.validate.distill import check_teacher

    check_teacher(resolved, tokenizer)
    if resolved.retrieval is not None:  # embedding / colbert: no chat template; prompts and lengths per side
        from leap_finetune.data.retrieval_tokens import RetrievalEncoder

        r = resolved.retrieval
        encoder = RetrievalEncoder(tokenizer, r.prompts, r.query_max_length, r.document_max_length)
        return tokenizer, encoder, prepare_data(resolved, tokenizer, encoder, console=console, examples=examples)
    template = load_chat_template(resolved.chat_template, tokenizer)
    # DPO / KTO split prompt from completion themselves and need no generation markers; GRPO renders prompts only
    loss_on = resolved.loss_on if "loss_on" in method_of(resolved).own_keys else "all"
    options = (
        tokenizer,
        template,
        loss_on,
        resolved.training.get("max_length"),
        resolved.training.get("truncation_mode", "keep_start"),
    )
    if resolved.vision:  # rows with images: each image decoded and counted in tokens by the model's processor
        from leap_finetune.data.images import VisionRenderer
        from leap_finetune.models.vision import image_reader

        renderer = VisionRenderer(*options, reader=image_reader(resolved, tokenizer))
    else:
        renderer = Renderer(*options)
    renderer.loss_on_thinking = resolved.training.get("loss_on_thinking", True) is not False
    prepared = prepare_data(resolved, tokenizer, renderer, console=console, examples=examples)
    prepared.notices = prepared.notices + trained_benchmark_notes(resolved, benchmarks, prepared)
    return tokenizer, renderer, prepared


def check_lora_targets(resolved: ResolvedConfig, tokenizer, console: Console | None = None) -> None:
    """LoRA's target_modules must name modules of this model (read from its config, no weights); the layers they
    adapt are said (a note when fewer than half of the linear layers: a pattern for another architecture)."""
    if resolved.peft is None:
        return
    from leap_finetune.models.structure import check_adapter_fits, meta_model, module_table
    from leap_finetune.models.structure import check_lora_targets as check_targets

    model = meta_model(
        resolved.model_id, tokenizer, resolved.training.get("model_init_kwargs"), head=resolved.retrieval is None
    )
    names = module_table(model) if model is not None else None
    if model is not None and resolved.adapter_path is not None:  # (an adapter of another base: said here)
        check_adapter_fits(resolved.adapter_path, model, resolved.model_id, resolved.config_path or "config")
    if names is not None:
        check_targets(resolved.peft, names, resolved.model_id, resolved.config_path or "config")
        if console is not None:
            from leap_finetune.models.structure import lora_coverage

            line, few = lora_coverage(resolved.peft, names)
            few_note = f"note: {line}: fewer than half - see docs/sft.md, LoRA's targets"
            console.print(few_note if few else line)


def check_training_arguments(resolved: ResolvedConfig, has_eval: bool, cuda: bool | None = None) -> None:
    """Build the trainer's config once, so a bad value fails now, not after the model loads."""
    from leap_finetune.config.rules import check_trainer_parts
    from leap_finetune.recipes import recipe

    module = recipe(resolved.training_type)
    where = resolved.config_path or "config"
    arguments = module.training_arguments(resolved, run_dir=os.devnull, has_eval=has_eval, cuda=cuda)
    _check_best_without_eval(arguments, resolved.training, where)

    def accepted() -> bool:  # (memo.py: asked of TRL again only when these arguments or the libraries change)
        config_cls = module.config_class()
        try:
            args = config_cls(**arguments)
        except (ValueError, TypeError) as err:
            raise LeapError(
                f"a value is not valid for TRL's {config_cls.__name__}: {err}",
                where=f"{where}: training_config",
                fix=f"see docs/config.md and TRL's {config_cls.__name__} documentation",
            ) from None
        check_trainer_parts(args, where, resolved.training)
        return True

    from leap_finetune.memo import remembered

    if {"optim", "optim_args", "optim_target_modules", "tf32"} & set(
        resolved.training
    ):  # (their acceptance depends on packages and the GPU: asked)
        accepted()
        return
    remembered("arguments", [resolved.training_type, arguments, resolved.training], accepted)


def _check_best_without_eval(arguments: dict, training: dict, where: str) -> None:
    """load_best_model_at_end compares evaluations; without evaluation rows nothing is evaluated (eval_strategy is
    `no` whatever the config says), and TRL's own words would blame an eval_strategy the user did not write."""
    if not arguments.get("load_best_model_at_end") or arguments.get("eval_strategy") != "no":
        return
    if training.get("eval_strategy") == "no":  # (the user's own choice, said in our words rather than TRL's)
        raise LeapError(
            "training_config.load_best_model_at_end keeps the checkpoint of the best evaluation, and "
            "eval_strategy is no: nothing is evaluated, so there is no best checkpoint to keep",
            where=f"{where}: training_config.load_best_model_at_end",
            fix="set eval_strategy: steps (with eval_steps equal to save_steps, or a divisor of them) and "
            "metric_for_best_model, or remove load_best_model_at_end",
        )
    raise LeapError(
        "training_config.load_best_model_at_end keeps the checkpoint of the best evaluation, and there are no "
        "evaluation rows (none held out, or every evaluation row invalid and skipped), so nothing is evaluated, "
        "whatever eval_strategy says",
        where=f"{where}: training_config.load_best_model_at_end",
        fix="hold rows out for evaluation with dataset.test_size (e.g. 0.1) or give them as dataset.val_path (valid "
        "rows: dataset.on_invalid: error lists each problem), or remove load_best_model_at_end",
    )


def check_async_eval(resolved: ResolvedConfig, devices: DevicePlan) -> None:
    if resolved.async_eval is not None and resolved.async_eval.mode != "sync":
        from leap_finetune.evaluation.async_eval import check_async_eval as check

        check(resolved, devices)


def check_run_folder_free(plan: RunPlan) -> None:
    """No live run holds the folder this run would use (checked again, for good, when the lock is taken)."""
    from leap_finetune.launch.run_lock import check_free

    if plan.run_dir.is_dir():
        check_free(plan.run_dir, "the run folder" if not plan.new_run else "output_dir")


def _memory_fit_of_the_run(resolved: ResolvedConfig, plan) -> ResolvedConfig:
    """A resumed run trains with the settings the memory fit chose for it (memory/budget.py, recorded in its
    resolved config), unless the config now sets them itself."""
    from leap_finetune.launch.plan import resumed_config

    if plan.new_run or plan.finished is not None:
        return resolved
    before, _ = resumed_config(plan)
    fitted = (before or {}).get("fitted_training") or {}
    kept = {k: v for k, v in fitted.items() if k not in resolved.user_training_keys}
    if not kept:
        return resolved
    return resolved.model_copy(update={"training": {**resolved.training, **kept}, "fitted_training": kept})
