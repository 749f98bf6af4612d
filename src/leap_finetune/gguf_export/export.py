"""`leap-finetune export RUN --gguf TYPE [--gguf TYPE ...]`, in this order: everything that can be refused is
refused before a model loads (types, llama.cpp for k-quants, the converter, the target folder, the disk space);
then, in a staging folder beside the target, the model is written as a transformers folder (a LoRA adapter merged,
the run's chat template, the base model's dtype), converted once per converter type, quantized by llama-quantize
for the others, a vision-language model's projector written as the mmproj file, and each file verified on the run's
benchmarks. The staging folder replaces the target only when all of that succeeded."""

from __future__ import annotations

import errno
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError
from leap_finetune.gguf_export.types import CONVERTER_TYPES, QUANTIZE_TYPES, needs_quantize, parse_types, source_type

# Bits per weight of each type (llama.cpp's figures, rounded up): the disk-space check before writing.
BITS = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "q6_k": 6.6, "q5_k_m": 5.7, "q5_k_s": 5.5, "q5_0": 5.5,
        "q5_1": 6, "q4_k_m": 4.9, "q4_k_s": 4.6, "q4_0": 4.5, "q4_1": 5, "iq4_nl": 4.5, "iq4_xs": 4.3,
        "q3_k_l": 4.3, "q3_k_m": 3.9, "q3_k_s": 3.5, "q2_k": 3.4}  # fmt: skip


def export_gguf(
    source: str,
    types: list[str],
    *,
    output: str | Path | None = None,
    llama_cpp: str | Path | None = None,
    verify: bool = True,
    console: Console | None = None,
    max_drop: float | None = None,
    max_kl: float | None = None,
    speed: bool = True,
    adapter: bool = False,
) -> Path:
    from leap_finetune.gguf_export.convert import check_converter
    from leap_finetune.gguf_export.llama_cpp import find_program
    from leap_finetune.models.trained import find_trained

    console = console or Console(stderr=True)
    types, bounds = _auto_types(parse_types(types), verify, max_drop, max_kl)
    trained = find_trained(source)
    adapter_job = _adapter_job(trained, source, llama_cpp) if adapter else None
    if adapter_job is not None:  # (the files are the base model's; the adapter beside them: gguf_export/adapter.py)
        trained = type(trained)(adapter_job["trained"].model_id, run_config=adapter_job["trained"].run_config)
    if bounds is not None:
        _auto_model(trained.model_id)
    source = str(Path(source).expanduser().resolve()) if Path(source).expanduser().exists() else source
    _refuse_encoder(trained, source)
    check_converter()
    quantizer = None
    if needs_quantize(types):
        first = next(t for t in types if t in QUANTIZE_TYPES)
        quantizer = find_program("llama-quantize", llama_cpp, why=first)
    tools = _tools(quantizer, llama_cpp, speed)
    output = _output_folder(output, source)
    _check_space(trained, types, output.parent)
    from leap_finetune.gguf_export.convert import check_architecture

    check_architecture(trained.model_id)
    measured = _measured(trained, verify, adapter_job, bounds)

    from leap_finetune.models.vision import is_vision_model

    vision = is_vision_model(trained.model_id)
    title = (trained.run_config or {}).get("project_name") or Path(source).expanduser().resolve().name
    stem = _file_stem(title)
    result: dict = {}

    def write(staging: Path) -> None:
        staging.mkdir(parents=True)
        result.update(
            _write(staging, output, trained, source, types, tools, vision, stem, title, measured, console, bounds)
        )
        if adapter_job is not None:
            result["files"].append(_write_adapter(staging, adapter_job, tools, stem, console))

    from leap_finetune import faults
    from leap_finetune.runs.atomic import replace_folder

    try:
        replace_folder(output, write, before_swap=lambda: faults.point("gguf-written"))
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise LeapError(
                "the disk filled up while writing the GGUF files (nothing was kept)",
                where=str(output.parent),
                fix="free space there, or give --output a folder on another disk",
            ) from None
        raise
    files = result["files"]
    console.print(f"exported {', '.join(files)} to {output} (README.md there: how to run each file)", markup=False)
    return output


def _write(staging: Path, final: Path, trained, source, types, tools, vision, stem, title, measured, console, bounds):
    from leap_finetune.export import export_trained
    from leap_finetune.gguf_export import device_speed
    from leap_finetune.gguf_export.card import write_card
    from leap_finetune.gguf_export.convert import convert
    from leap_finetune.gguf_export.llama_cpp import quantize
    from leap_finetune.gguf_export.verify import print_table, verify

    scratch = staging / ".transformers"  # the folder converted from; removed before the swap
    merging = " (the LoRA adapter merged into its base)" if trained.adapter_dir is not None else ""
    console.print(f"writing the model as a transformers folder{merging} ...", markup=False)
    hf = export_trained(trained, merge=True, output=scratch / "merged", console=_Warnings(console))
    _check_space_for_files(hf, types, staging)
    files: dict[str, Path] = {}
    for gguf_type in types:
        if gguf_type in CONVERTER_TYPES:
            console.print(f"converting to {gguf_type} (llama.cpp's converter) ...", markup=False)
            files[gguf_type] = convert(hf, staging / f"{stem}-{gguf_type}.gguf", gguf_type, name=title, source=source)
    quantizer = tools.quantizer
    if quantizer is not None:
        start = source_type(types, _dtype(hf))
        start_file = files.get(start) or convert(hf, scratch / f"{stem}-{start}.gguf", start, name=title, source=source)
        for gguf_type in types:
            if gguf_type in QUANTIZE_TYPES:
                console.print(f"quantizing to {gguf_type} (llama-quantize, from {start}) ...", markup=False)
                target = staging / f"{stem}-{gguf_type}.gguf"
                quantize(quantizer, start_file, target, gguf_type)
                files[gguf_type] = target
    files = {t: files[t] for t in types}  # (in the order given)
    mmproj = None
    if vision:
        mm_type = "f32" if types == ["f32"] else "f16"
        console.print(f"writing the vision encoder and projector (mmproj, {mm_type}) ...", markup=False)
        mmproj = convert(hf, staging / f"mmproj-{stem}-{mm_type}.gguf", mm_type, mmproj=True, name=title, source=source)
    verification = verify(*measured, hf, files, console)
    print_table(verification, console)
    speed = device_speed.measure(tools.bench, files, console, tools.why_no_bench)
    device_speed.print_speed(speed, console)
    device_speed.plot(staging, verification, speed, files)
    parity = _parity(tools, files, measured, hf, console)
    choice = _choose(verification, files, bounds, console) if bounds is not None else None
    if choice is not None:
        files = {choice.chosen: files[choice.chosen]}
        types = [choice.chosen]
    shutil.rmtree(scratch)
    write_card(
        staging,
        title=title,
        source=str(source),
        files=files,
        mmproj=mmproj,
        verification=verification,
        choice=choice.as_json() if choice is not None else None,
        speed=speed,
        parity=parity,
        eval_command=None
        if verification.skipped
        else f"leap-finetune eval YOUR_CONFIG.yaml --set checkpoint={final / files[types[0]].name}",
    )
    record = {
        "source": str(source),
        "files": {t: p.name for t, p in files.items()},
        "mmproj": mmproj.name if mmproj else None,
        "verification": verification.as_json(),
        "device": speed,
        "serving_parity": parity,
        **({"auto": choice.as_json()} if choice is not None else {}),
    }
    (staging / "quantization.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return {"files": [p.name for p in files.values()] + ([mmproj.name] if mmproj else [])}


@dataclass(frozen=True)
class _Tools:
    """llama.cpp's programs the export runs: llama-quantize (k-quants), llama-bench (the device speed; optional)."""

    quantizer: Path | None
    bench: Path | None
    why_no_bench: str | None
    server: Path | None = None  # llama-server: the serving-parity check (gguf_export/parity.py)
    why_no_server: str | None = None


def _tools(quantizer, llama_cpp, speed: bool) -> _Tools:
    from leap_finetune.gguf_export.llama_cpp import BUILD_HINT, find_program

    def optional(name: str) -> tuple[Path | None, str | None]:
        try:
            return find_program(name, llama_cpp, why=name), None
        except LeapError:
            return None, f"{name} not found; {BUILD_HINT}"

    bench = optional("llama-bench") if speed else (None, "--no-speed was given")
    return _Tools(quantizer, *bench, *optional("llama-server"))


def _refuse_encoder(trained, source: str) -> None:
    from leap_finetune.methods import method_of

    kind = trained.retrieval_type()
    if kind is not None:
        raise LeapError(
            f"GGUF export is for chat models; this is {method_of(kind).trains}",
            where=source,
            fix="export it as a sentence-transformers folder: leap-finetune export RUN (without --gguf)",
        )


def _measured(trained, verify: bool, adapter_job: dict | None, bounds) -> tuple:
    """(the run's resolved config with its benchmarks, or None and why not): what each file is scored on. With
    --gguf-adapter the files are the untrained base: the trained model is scored as base + adapter instead."""
    from leap_finetune.gguf_export.verify import benchmarks_of

    measured = benchmarks_of(trained.run_config) if verify else (None, "--no-verify was given")
    if adapter_job is not None:
        adapter_job["measured"] = measured
        measured = (None, "--gguf-adapter: these files hold the untrained base; the trained model is verified as the "
                    "base with its adapter, below")  # fmt: skip
    if bounds is not None:
        from leap_finetune.gguf_export.auto import check_auto

        check_auto(verify, measured)
    return measured


def _adapter_job(trained, source: str, llama_cpp) -> dict:
    from leap_finetune.gguf_export.adapter import find_adapter, find_converter

    return {"trained": find_adapter(trained, source), "script": find_converter(llama_cpp)}


def _auto_model(model_id: str) -> None:
    from leap_finetune.gguf_export.auto import check_model

    check_model(model_id)


def _write_adapter(staging: Path, job: dict, tools: _Tools, stem: str, console) -> str:
    """--gguf-adapter: the adapter converted beside the base files, verified as the base with it (llama-server)
    against the merged model; its section added to the card and quantization.json. Returns the file's name."""
    from leap_finetune.export import export_trained
    from leap_finetune.gguf_export import adapter

    trained = job["trained"]
    scratch = staging / ".adapter"
    console.print("writing the LoRA adapter as GGUF (llama.cpp's convert_lora_to_gguf.py) ...", markup=False)
    base = export_trained(
        type(trained)(trained.model_id, run_config=trained.run_config), merge=True, output=scratch / "base",
        console=_Warnings(console),
    )  # fmt: skip
    target = adapter.convert_adapter(job["script"], base, trained.adapter_dir, staging / f"{stem}-lora-f16.gguf")
    merged = export_trained(trained, merge=True, output=scratch / "merged", console=_Warnings(console))
    record = json.loads((staging / "quantization.json").read_text(encoding="utf-8"))
    base_file = staging / next(iter(record["files"].values()))
    found = adapter.verify(tools.server, base_file, target, job["measured"], merged, console)
    adapter.print_verification(found, console)
    shutil.rmtree(scratch)
    record["adapter"] = {"file": target.name, "base_file": base_file.name, "verification": found}
    (staging / "quantization.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    card = staging / "README.md"
    card.write_text(card.read_text(encoding="utf-8") + "\n" + "\n".join(adapter.card_lines(target, base_file, found))
                    + "\n", encoding="utf-8")  # fmt: skip
    return target.name


def _parity(tools: _Tools, files: dict, measured: tuple, hf: Path, console) -> dict:
    """The benchmark prompts rendered by llama-server from the file's template against training's rendering."""
    from leap_finetune.gguf_export import parity

    resolved, why_not = measured
    if resolved is None:
        found = {"skipped": why_not}
    else:
        items = parity.benchmark_items(resolved)
        renderer = parity.renderer_for(hf, resolved)
        found = parity.check(tools.server, next(iter(files.values())), items, renderer, tools.why_no_server)
    parity.print_parity(found, console)
    return found


def _auto_types(types: list[str], verify: bool, max_drop, max_kl) -> tuple[list[str], tuple | None]:
    """`--gguf auto`: the ladder to export and the bounds to choose by (gguf_export/auto.py); else the types as
    given, and no bounds (which then must not be given)."""
    from leap_finetune.gguf_export import auto

    if types != ["auto"]:
        if max_drop is not None or max_kl is not None:
            raise LeapError("--max-drop and --max-kl go with --gguf auto", where="export", fix="add --gguf auto")
        return types, None
    bounds = (
        auto.DEFAULT_MAX_DROP if max_drop is None else max_drop,
        auto.DEFAULT_MAX_KL if max_kl is None else max_kl,
    )
    auto.check_bounds(*bounds)
    auto.check_auto(verify, (True, None))  # (--no-verify: refused before anything else)
    return list(auto.LADDER), bounds


def _choose(verification, files: dict, bounds: tuple[float, float], console):
    """--gguf auto: the smallest file within the bounds (gguf_export/auto.py); the others are removed from the
    staging folder (the table is their evidence), or nothing is kept."""
    from leap_finetune.gguf_export.auto import choose, print_choice, refuse_none

    choice = choose(verification, files, *bounds)
    print_choice(choice, console)
    if choice.chosen is None:
        raise refuse_none(choice)
    for gguf_type, path in files.items():
        if gguf_type != choice.chosen:
            path.unlink()
    console.print(f"--gguf auto: keeping {choice.chosen}, the smallest within the bounds", markup=False)
    return choice


class _Warnings:
    """A console for export_trained that passes its warnings on (the merged folder is scratch: its own success line is
    not the user's news)."""

    def __init__(self, console: Console):
        self.console = console

    def print(self, text, **kwargs) -> None:
        if str(text).startswith("warning"):
            self.console.print(text, **kwargs)


def _dtype(model_dir: Path) -> str | None:
    """The dtype a saved model's config.json records (`bfloat16`, `float16`, `float32`), or None."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return config.get("dtype") or config.get("torch_dtype") or (config.get("text_config") or {}).get("dtype")


def _float16(model_dir: Path) -> bool:
    return _dtype(model_dir) in ("bfloat16", "float16")


def _output_folder(output: str | Path | None, source: str) -> Path:
    """The folder to write (default: export-gguf/ in the given folder): a new or empty folder, somewhere writable."""
    from leap_finetune.files import check_writable

    if output is None:
        base = Path(source).expanduser()
        output = (base if base.is_dir() else Path.cwd()) / "export-gguf"
    output = Path(output).expanduser().resolve()
    if output.exists() and not output.is_dir():
        raise LeapError("this is a file, not a folder", where=str(output), fix="give --output a folder path")
    if output.exists() and any(output.iterdir()):
        raise LeapError(
            "the output folder exists and is not empty",
            where=str(output),
            fix="choose another --output, or remove the folder",
        )
    check_writable(output.parent, "--output")
    return output


def _file_stem(title: str) -> str:
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in title).strip("-.")
    return stem or "model"


def _check_space(trained, types: list[str], folder: Path) -> None:
    """Refuse before writing when the files cannot fit: the merged model, each type, and a converted starting
    file for llama-quantize, estimated from the weights' size on disk."""
    weights = (
        sum(f.stat().st_size for f in Path(trained.model_id).glob("*.safetensors"))
        if Path(trained.model_id).is_dir()
        else 0
    )
    if not weights:
        return  # (a Hub model or a tiny built-in one: nothing on disk to measure; the write reports a full disk)
    params = weights / 2 if _float16(Path(trained.model_id)) else weights / 4
    needed = weights + sum(params * BITS[t] / 8 for t in types) + (params * 2 if needs_quantize(types) else 0)
    _refuse_short(needed, folder)


def _check_space_for_files(model_dir: Path, types: list[str], folder: Path) -> None:
    """Once the model is written as a transformers folder (a LoRA adapter merged: its size known only now): room
    for the GGUF files?"""
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    params = weights / 2 if _float16(model_dir) else weights / 4
    _refuse_short(sum(params * BITS[t] / 8 for t in types) + (params * 2 if needs_quantize(types) else 0), folder)


def _refuse_short(needed: float, folder: Path) -> None:
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise LeapError(
            f"not enough disk space: about {needed / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free",
            where=str(folder),
            fix="free space there, or give --output a folder on another disk",
        )
