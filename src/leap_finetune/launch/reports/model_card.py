"""The model card of a finished run (README.md in the run folder, in model/ and in adapter/): what was
trained on what, how, with which results, and how to load it - valid Hub model-card metadata
(huggingface_hub's ModelCard), so the folder can be uploaded as it is.

Written by the driver after training, from the summary, the data report and the resolved config; it
replaces the generic card TRL writes into the output folder.
"""

from __future__ import annotations

from pathlib import Path

from leap_finetune import __version__
from leap_finetune.config.yaml_io import dump_yaml
from leap_finetune.files import read_metrics
from leap_finetune.launch.facts import RunFacts
from leap_finetune.methods import method_of
from leap_finetune.models.tiny import TINY_MODELS
from leap_finetune.runs.folder import RunFolder


def _hub_id(name: str) -> str | None:
    return name if name.count("/") == 1 and not name.startswith((".", "/", "~")) and not Path(name).exists() else None


def snippet(resolved, summary: dict, adapter: bool) -> str:
    """Python that loads the trained model and answers (or encodes), as pasted by the user."""
    model_dir = summary["model_dir"]
    prompts = getattr(getattr(resolved, "retrieval", None), "prompts", None)
    query_prompt = ', prompt_name="query"' if prompts is not None and prompts.query else ""
    encoder = method_of(resolved).encoder_class
    if encoder == "SentenceTransformer":
        return (
            f'from sentence_transformers import SentenceTransformer\n\nmodel = SentenceTransformer("{model_dir}")\n'
            f'embeddings = model.encode(["What is the capital of France?"]{query_prompt})\n'
            "print(embeddings.shape)"
        )
    if encoder == "MultiVectorEncoder":
        return (
            f'from sentence_transformers import MultiVectorEncoder\n\nmodel = MultiVectorEncoder("{model_dir}")\n'
            f'vectors = model.encode(["What is the capital of France?"]{query_prompt})\nprint(len(vectors[0]))'
        )
    if _vision(resolved):
        return _vision_snippet(resolved, summary, adapter)
    if adapter:
        base = resolved.model_id
        if base in TINY_MODELS:  # a built-in tiny model is not a Hub id: leap-finetune builds it
            load_base = (
                f"from leap_finetune.models.loading import load_model, load_tokenizer\n\n"
                f'tokenizer = AutoTokenizer.from_pretrained("{summary["adapter_dir"]}")\n'
                f'base = load_model("{base}", tokenizer)\n'
            )
        else:
            load_base = (
                f'base = AutoModelForCausalLM.from_pretrained("{base}")\n'
                f'tokenizer = AutoTokenizer.from_pretrained("{summary["adapter_dir"]}")\n'
            )
        load = (
            f"from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f'{load_base}model = PeftModel.from_pretrained(base, "{summary["adapter_dir"]}")\n'
        )
    else:
        load = (
            f"from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model = AutoModelForCausalLM.from_pretrained("{model_dir}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{model_dir}")\n'
        )
    return load + (
        'messages = [{"role": "user", "content": "What is the capital of France?"}]\n'
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", '
        "return_dict=True)\n"
        "output = model.generate(**inputs, max_new_tokens=64)\n"
        'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))'
    )


# The image the snippet of a vision-language model asks about when the run's benchmarks have none (two cats on a
# sofa, from COCO: the image of transformers' own examples)
EXAMPLE_IMAGE = "http://images.cocodataset.org/val2017/000000039769.jpg"


def _vision(resolved) -> bool:
    from leap_finetune.models.vision import is_vision_model

    return not method_of(resolved).retrieval and is_vision_model(resolved.model_id)


def _benchmark_image(resolved) -> str | None:
    """The first image of the run's benchmark rows (a file that exists, or a URL): the snippet then runs as
    pasted on this machine and asks about an image like those the run was scored on."""
    import json

    from leap_finetune.data.messages import MESSAGE_COLUMNS

    for bench in getattr(getattr(resolved, "evals", None), "benchmarks", None) or []:
        path = Path(str(getattr(bench, "path", "") or ""))
        try:
            lines = path.read_text(encoding="utf-8").splitlines()[:50]
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            messages = next((row.get(c) for c in MESSAGE_COLUMNS if c in row), None) if isinstance(row, dict) else None
            for message in messages if isinstance(messages, list) else []:
                content = message.get("content") if isinstance(message, dict) else None
                for part in content if isinstance(content, list) else []:
                    if not isinstance(part, dict) or part.get("type") != "image":
                        continue
                    source = part.get("image") or part.get("path") or part.get("url")  # (as data/messages.py reads)
                    if not isinstance(source, str) or not source:
                        continue
                    if source.startswith(("http://", "https://")):
                        return source
                    file = path.parent / Path(source).expanduser()
                    if file.is_file():
                        return str(file.resolve())
    return None


def _keywords(settings: dict) -> str:
    return "".join(f", {key}={value!r}" for key, value in settings.items())


def _vision_snippet(resolved, summary: dict, adapter: bool) -> str:
    """A vision-language model: AutoModelForImageTextToText and its processor, a message with an image part."""
    model_dir = summary["model_dir"]
    if adapter:
        base, adapter_dir = resolved.model_id, summary["adapter_dir"]
        # the run's image_processor: settings (its model/ is saved with them; the base model's processor is not)
        configured = getattr(resolved, "image_processor", None)
        settings = configured.settings() if configured is not None else {}
        if base in TINY_MODELS:  # a built-in tiny model is not a Hub id: leap-finetune builds it and its processor
            load = (
                "from peft import PeftModel\nfrom transformers import AutoTokenizer\n"
                "from transformers.image_utils import load_image\n"
                "from leap_finetune.models.loading import load_model\n"
                "from leap_finetune.models.vision import load_processor\n\n"
                f'tokenizer = AutoTokenizer.from_pretrained("{adapter_dir}")\n'
                f'processor = load_processor("{base}", tokenizer{", " + repr(settings) if settings else ""})\n'
                f'model = PeftModel.from_pretrained(load_model("{base}", tokenizer), "{adapter_dir}")\n'
            )
        else:
            load = (
                "from peft import PeftModel\n"
                "from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer\n"
                "from transformers.image_utils import load_image\n\n"
                f'processor = AutoProcessor.from_pretrained("{base}"{_keywords(settings)})\n'
                "# the tokenizer and chat template the run trained with\n"
                f'processor.tokenizer = AutoTokenizer.from_pretrained("{adapter_dir}")\n'
                f'base = AutoModelForImageTextToText.from_pretrained("{base}")\n'
                f'model = PeftModel.from_pretrained(base, "{adapter_dir}")\n'
            )
        load += "processor.chat_template = processor.tokenizer.chat_template\n"
    else:
        load = (
            "from transformers import AutoModelForImageTextToText, AutoProcessor\n"
            "from transformers.image_utils import load_image\n\n"
            f'model = AutoModelForImageTextToText.from_pretrained("{model_dir}")\n'
            f'processor = AutoProcessor.from_pretrained("{model_dir}")\n'
        )
    image = _benchmark_image(resolved)
    return load + (
        f'image = load_image("{image or EXAMPLE_IMAGE}")  # a file or an http(s) URL\n'
        "messages = [\n"
        '    {"role": "user", "content": [{"type": "image", "image": image}, '
        '{"type": "text", "text": "What is in this image?"}]}\n'
        "]\n"
        "inputs = processor.apply_chat_template(\n"
        '    messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"\n'
        ").to(model.device)\n"
        "output = model.generate(**inputs, max_new_tokens=64)\n"
        'print(processor.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))'
    )


def _metadata(resolved, prepared, adapter: bool) -> dict:
    from leap_finetune.data.prepared import dataset_items

    tags = ["leap-finetune", resolved.training_type]
    if resolved.model_family in ("lfm2", "lfm2.5"):
        tags += ["liquid", resolved.model_family]
    if adapter:
        tags.append("lora")
    data = {
        "library_name": "sentence-transformers"
        if method_of(resolved).retrieval
        else "peft"
        if adapter
        else "transformers",
        "pipeline_tag": "sentence-similarity"
        if method_of(resolved).retrieval
        else "image-text-to-text"
        if _vision(resolved)
        else "text-generation",
        "tags": tags,
    }
    base = _hub_id(resolved.model_id)
    if base:
        data["base_model"] = base
    hub_data = [d.path for d in dataset_items(resolved) if _hub_id(d.path)]
    if hub_data:
        data["datasets"] = hub_data
    return data


def _number(value, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def _best_eval(run_dir: Path) -> tuple[float, int] | None:
    """(the lowest eval loss, its step) in metrics.jsonl."""
    losses = [
        (r["eval_loss"], r["step"])
        for r in read_metrics(RunFolder(run_dir).metrics)
        if isinstance(r.get("eval_loss"), (int, float))
    ]
    return min(losses, key=lambda pair: pair[0]) if losses else None


def _metric(metrics: dict | None, name: str):
    """A held-out retrieval metric (eval_retrieval_<score function>_<name>: cosine, maxsim, ...)."""
    return next(
        (v for k, v in (metrics or {}).items() if k.startswith("eval_retrieval_") and k.endswith(f"_{name}")), None
    )


def retrieval_results(summary: dict) -> list[tuple[str, float | None, float]]:
    """(metric, before, after) of an embedding / ColBERT run: the held-out queries' nDCG@10, MRR@10 and
    recall@10, then each retrieval benchmark's nDCG@10."""
    rows = []
    if summary.get("ndcg@10") is not None:
        rows.append(("held-out nDCG@10", summary.get("initial_ndcg@10"), summary["ndcg@10"]))
    for name in ("mrr@10", "recall@10"):
        after = _metric(summary.get("eval_metrics"), name)
        if after is not None:
            rows.append(
                (f"held-out {name.replace('mrr', 'MRR')}", _metric(summary.get("initial_eval_metrics"), name), after)
            )
    for name, after in (summary.get("retrieval_benchmarks") or {}).items():
        if after is not None:
            rows.append((f"{name} nDCG@10", (summary.get("initial_retrieval_benchmarks") or {}).get(name), after))
    return rows


def _data_rows(prepared) -> list[str]:
    """One row per file read: a source's `path`, and its `val_path` (every row held out) on a row of its own."""
    lines = []
    for s in prepared.sources:
        held_out = 0 if s.val_path else s.eval_rows
        lines.append(
            f"| `{s.path}` | {s.rows_read:,} | {s.valid:,} | {s.train_rows:,} | {held_out:,} | "
            f"{s.mixing or '-'} | {s.train_tokens:,} |"
        )
        if s.val_path:
            lines.append(
                f"| `{s.val_path}` (held out) | {s.val_rows_read:,} | {s.val_valid:,} | - | {s.eval_rows:,} | - | - |"
            )
    return lines


def _resume_changes(run_dir: Path) -> list[dict]:
    import json

    try:
        value = json.loads(RunFolder(run_dir).resume_changes.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return (
        [c for c in value if isinstance(c, dict) and {"step", "key", "before", "now"} <= set(c)]
        if isinstance(value, list)
        else []
    )


def _lengths_row(resolved) -> str:
    if method_of(resolved).retrieval:  # (no packing; each side cut to its own length)
        r = resolved.retrieval
        own = "the encoder's own"
        return f"| max length query / document | {r.query_max_length or own} / {r.document_max_length or own} |"
    return (
        f"| max length / packing | {resolved.training.get('max_length')} / {resolved.training.get('packing', False)} |"
    )


def _use_it_too(resolved) -> str:
    run_dir = resolved.run_dir
    if method_of(resolved).retrieval:  # (an encoder: nothing to chat with)
        return (
            f"Score it on a retrieval benchmark: `leap-finetune eval CONFIG` with `checkpoint: {run_dir}` and a "
            f"benchmark of `metric: retrieval`; `leap-finetune export {run_dir}` copies it as a "
            "sentence-transformers folder."
        )
    gguf = (
        f" For llama.cpp, Ollama or LM Studio: `leap-finetune export {run_dir} --gguf q8_0` writes GGUF files (and, "
        "for a vision-language model, the mmproj file) with their scores on this run's benchmarks (docs/export.md)."
    )
    if _vision(resolved):
        return (
            f"Or in the terminal: `leap-finetune chat {run_dir} --image IMAGE` (`/image PATH` attaches one to the "
            "next message)." + gguf
        )
    return f"Or in the terminal: `leap-finetune chat {run_dir}`." + gguf


def _teacher_words(distill: dict) -> str:
    """distill: which teacher, and how (the card says where the student's knowledge came from)."""
    how = distill["loss"] + (f" (beta {distill['beta']:g})" if distill["loss"] == "jsd" else "")
    how += f", temperature {distill['temperature']:g}" + (f", {distill['mix']:g} SFT loss" if distill["mix"] else "")
    return f", distilled from teacher `{distill['teacher']}` ({distill['mode']}, {how})"


def card_text(resolved, prepared, summary: dict, facts: RunFacts, adapter: bool) -> str:
    from huggingface_hub import ModelCard, ModelCardData

    from leap_finetune.config.quantization import is_quantized, lora_name

    run_dir = Path(resolved.run_dir)
    method = (
        f"{lora_name(resolved.training)} (r={resolved.peft.get('r')}, alpha={resolved.peft.get('lora_alpha')})"
        + (", merged into the unquantized base" if is_quantized(resolved.training.get("model_init_kwargs")) else "")
        if resolved.peft
        else "full fine-tune"
    )
    lines = [
        f"# {resolved.run_name}",
        "",
        f"**{resolved.training_type.upper()}** of `{resolved.model_name}`, {method}"
        + (_teacher_words(resolved.distill) if resolved.distill else "")
        + (f", continuing the LoRA adapter `{resolved.adapter_path}`" if resolved.adapter_path else "")
        + f", trained with leap-finetune {__version__}.",
        "",
    ]
    lines += _data_section(resolved, prepared)
    lines += _training_section(resolved, summary, facts)
    lines += _results_section(summary, run_dir)
    lines += ["## Use it", "", "```python", snippet(resolved, summary, adapter), "```", "", _use_it_too(resolved), ""]
    lines += [
        "## Config",
        "",
        "<details><summary>resolved_config.yaml (every value after profiles and defaults)</summary>",
        "",
        "```yaml",
        dump_yaml(resolved.to_json_dict()).rstrip(),
        "```",
        "",
        "</details>",
        "",
    ]
    card = ModelCard.from_template(
        ModelCardData(**_metadata(resolved, prepared, adapter)),
        template_str="---\n{{ card_data }}\n---\n\n{{ body }}\n",
        body="\n".join(lines),
    )
    return str(card)


def _data_section(resolved, prepared) -> list[str]:
    lines = [
        "## Data",
        "",
        "| source | rows read | valid | train | eval | mix | tokens used |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += _data_rows(prepared)
    retrieval = method_of(resolved).retrieval
    loss_tokens = "" if retrieval else f" ({prepared.trained_tokens:,} carrying loss)"  # (every token of a text)
    return lines + [
        "",
        f"{len(prepared.train):,} training rows, {prepared.train_tokens:,} tokens{loss_tokens}; "
        f"{len(prepared.eval):,} held out. "
        f"Not trained on: {prepared.invalid_skipped:,} invalid row(s) skipped, {prepared.fully_truncated:,} "
        f"with every trained token beyond max_length"
        + (" (listed in dropped_rows.jsonl)." if prepared.dropped else "."),
        "",
    ]


def _training_section(resolved, summary: dict, facts: RunFacts) -> list[str]:
    """The settings, the batch and the precision as plan and the run's start said them (launch/facts.py), the
    steps and time as the run went."""
    training = resolved.training
    per_device = f"{facts.micro_batch} (batch_tokens)" if training.get("batch_tokens") else facts.micro_batch
    lines = [
        "## Training",
        "",
        "| setting | value |",
        "| --- | --- |",
        f"| learning rate | {training.get('learning_rate')} |",
        f"| epochs / max steps | {training.get('num_train_epochs')} / {facts.max_steps} |",
        f"| batch per device x accumulation x workers | {per_device} x {facts.accumulation} x {facts.workers} "
        f"= {facts.global_batch} per step |",
        _lengths_row(resolved),
        *_experts_rows(resolved),
        *_qat_rows(resolved),
        f"| steps | {summary.get('global_step')} |",
    ]
    if isinstance(summary.get("train_runtime_s"), (int, float)):
        lines.append(f"| training time | {summary['train_runtime_s']:,.1f} s |")
    if summary.get("tokens_seen"):  # (a number only where the trainer counts them)
        lines.append(f"| tokens seen | {summary['tokens_seen']:,} |")
    lines.append(f"| hardware | {hardware_line(facts, summary).removeprefix('devices: ')} |")
    if summary.get("peak_gpu_memory_gib") is not None:
        from leap_finetune.recipes.summary import gpu_memory_text

        lines.append(f"| GPU memory | {gpu_memory_text(summary)} |")
    lines.append(f"| precision | {facts.precision} |")
    run_dir = Path(resolved.run_dir)
    for change in _resume_changes(run_dir):  # (resume_allow_changes: the values above hold from that step on)
        lines.append(
            f"| changed on resume at step {change['step']} | {change['key'].removeprefix('training_config.')}: "
            f"{change['before']!r} -> {change['now']!r} |"
        )
    return lines + [""]


def _qat_rows(resolved) -> list[str]:
    """Quantization-aware training: the format the weights trained through, and the export that matches it."""
    if not resolved.qat:
        return []
    target, start = resolved.qat["target"], resolved.qat["start_step"]
    export = f"; ship it as `leap-finetune export RUN --gguf {target}`"
    since = f" from step {start}" if start else ""
    return [f"| quantization-aware training | trained for {target}{since}: its linear layers ran through {target}'s "
            f"rounding{export} |"]  # fmt: skip


def _experts_rows(resolved) -> list[str]:
    """A mixture of experts: its total and active parameters, and the router losses it trained with."""
    from leap_finetune.memory.shapes import model_shape
    from leap_finetune.models.architectures import supports
    from leap_finetune.models.registry import model_type

    if not supports(model_type(resolved.model_id), "moe"):
        return []
    rows = []
    shape = model_shape(resolved.model_id)
    if shape is not None:
        rows.append(
            f"| parameters | {shape.parameters:,} ({shape.active_parameters:,} active per token: "
            f"{shape.experts_per_token} of {shape.experts} experts) |"
        )
    aux = resolved.training.get("router_aux_loss_coef")
    z = resolved.training.get("router_z_loss_coef") or 0
    said = f"x {aux:g}" if aux is not None else "x the model's own coefficient, or 0.001 (docs/moe.md)"
    return rows + [f"| router losses | load-balancing {said}; z-loss x {z:g} |"]


def hardware_line(facts: RunFacts, summary: dict) -> str:
    """The model card's hardware: the devices, and how DDP all-reduced the gradients as it reported it."""
    ran = summary.get("gradient_all_reduce")
    return facts.hardware + (f"; gradients all-reduced in {ran}" if ran and ran != "fp32" else "")


def _results_section(summary: dict, run_dir: Path) -> list[str]:
    lines = ["## Results", "", "| metric | before | after |", "| --- | --- | --- |"]
    if summary.get("train_loss") is not None:
        lines.append(f"| train loss (mean) | - | {_number(summary['train_loss'])} |")
    if summary.get("eval_loss") is not None:
        lines.append(f"| eval loss | {_number(summary.get('initial_eval_loss'))} | {_number(summary['eval_loss'])} |")
        best = _best_eval(run_dir)
        if best:
            lines.append(f"| best eval loss | - | {_number(best[0])} (step {best[1]}) |")
    for key, after in (summary.get("eval_metrics") or {}).items():
        if key.startswith("eval_rewards/") or key in ("eval_kl",):
            before = (summary.get("initial_eval_metrics") or {}).get(key)
            lines.append(f"| {key.removeprefix('eval_')} | {_number(before)} | {_number(after)} |")
    for key, after in (summary.get("benchmarks") or {}).items():
        before = (summary.get("initial_benchmarks") or {}).get(key)
        lines.append(f"| {key} | {_number(before)} | {_number(after)} |")
    if summary.get("final_reward") is not None:
        lines.append(
            f"| reward (first / last 5 steps) | {_number(summary.get('initial_reward'))} | "
            f"{_number(summary['final_reward'])} |"
        )
    for name, before, after in retrieval_results(summary):
        lines.append(f"| {name} | {_number(before)} | {_number(after)} |")
    return lines + ["", "Plots: `plots/` in the run folder; every logged value: `metrics.jsonl`.", ""]


def write_model_cards(resolved, prepared, summary: dict, facts: RunFacts) -> list[Path]:
    """README.md in the run folder and in model/ (and adapter/, with the adapter's snippet)."""
    from leap_finetune.files import write_atomic

    run_dir = Path(resolved.run_dir)
    written = []
    adapter = bool(summary.get("adapter_dir"))
    for folder, as_adapter in (
        (run_dir, False),
        (Path(summary["model_dir"]), False),
        (Path(summary["adapter_dir"]) if adapter else None, True),
    ):
        if folder is None or not folder.is_dir():
            continue
        write_atomic(folder / "README.md", card_text(resolved, prepared, summary, facts, as_adapter))
        written.append(folder / "README.md")
    return written
