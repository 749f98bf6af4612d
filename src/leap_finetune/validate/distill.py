"""`training_type: distill` checked at `validate`: a teacher is named, it resolves like `model_name` (a Hub id, a
folder, a run's model/), it shares the student's tokenizer (the same token for the same id, or the two
distributions would be compared position by position over different words), and its next-token distribution covers
the tokenizer; `teacher:` and `distill:` on another training type are refused."""

from __future__ import annotations

from pathlib import Path

from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.config.schema_distill import DistillConfig
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of


def resolve_distill(model: LeapConfigModel, base: Path, where: str) -> dict | None:
    if not method_of(model).teacher:
        for key in ("teacher", "distill"):
            if getattr(model, key) is not None:
                raise LeapError(
                    f"'{key}:' applies to training_type: distill, and training_type is {model.training_type}",
                    where=where,
                    fix=f"remove {key}, or set training_type: distill",
                )
        return None
    if model.teacher is None:
        raise LeapError(
            "training_type distill needs a teacher: the model whose next-token distributions the student learns",
            where=where,
            fix="add e.g. teacher: LiquidAI/LFM2-2.6B (a Hub id, a local folder, or a run of this project)",
        )
    from leap_finetune.models.registry import resolve_model_id

    try:
        teacher_id = resolve_model_id(model.teacher, base)
    except LeapError as err:
        raise LeapError(err.message.replace("model_name", "teacher"), where=f"{where}: teacher", fix=err.fix) from None
    settings = model.distill or DistillConfig()
    _check_the_teacher_teaches(model, settings, teacher_id, base, where)
    if settings.mode == "on_policy":
        for key in ("packing", "batch_tokens"):
            if (model.training_config or {}).get(key):
                raise LeapError(
                    f"training_config.{key} builds rows of several conversations; distill.mode on_policy samples an "
                    "answer for each row's prompt, one conversation per row",
                    where=f"{where}: training_config.{key}",
                    fix=f"remove {key} (on_policy batches are padded rows), or use mode: offline",
                )
        _check_answer_fits(model, settings, where)
    return {"teacher": model.teacher, "teacher_id": teacher_id, **settings.model_dump()}


def _check_answer_fits(model: LeapConfigModel, settings: DistillConfig, where: str) -> None:
    """An answer of max_new_tokens must fit a row of max_length beside its prompt: one that cannot is sampled in
    full at every step (the longest part of the step) and then cut off unseen."""
    length = (model.training_config or {}).get("max_length")
    if isinstance(length, int) and not isinstance(length, bool) and settings.max_new_tokens >= length:
        raise LeapError(
            f"distill.max_new_tokens is {settings.max_new_tokens}, but training_config.max_length is {length}: the "
            "sampled answer and its prompt must fit in max_length tokens, so most of every answer would be sampled "
            "and then cut off",
            where=f"{where}: distill.max_new_tokens",
            fix=f"set max_new_tokens below max_length (e.g. {max(1, length // 2)}), or raise max_length",
        )


def _check_the_teacher_teaches(model: LeapConfigModel, settings: DistillConfig, teacher_id: str, base, where: str):
    """Two configs that run, and learn nothing from the teacher: mix 1 (the loss is the cross-entropy alone) and the
    student's own model as its teacher without cross-entropy (the divergence is 0 from the first step, and stays so)."""
    from leap_finetune.models.registry import resolve_model_id

    if settings.mix >= 1:
        raise LeapError(
            "distill.mix is 1: the loss is SFT's cross-entropy alone, and the teacher (loaded or asked every step) "
            "weighs nothing in it",
            where=f"{where}: distill.mix",
            fix="lower mix (0 is the divergence alone, 0.5 both halves), or train with training_type: sft",
        )
    try:
        student_id = resolve_model_id(model.model_name, base)
    except LeapError:
        return  # (model_name's own check says what is wrong with it)
    if settings.mix == 0 and (student_id == teacher_id or _same_weights(student_id, teacher_id)):
        raise LeapError(
            f"the teacher is the student's own model ({model.teacher}"
            + (f", the same weights as {model.model_name}" if student_id != teacher_id else "")
            + "): their distributions are equal at the first "
            "step, the divergence is 0 and stays 0 - nothing would train",
            where=f"{where}: teacher",
            fix="distil from a larger or fine-tuned model of the same family; or keep the model as an anchor with "
            "mix above 0 (the data's cross-entropy, held near the original model by the divergence)",
        )


def check_teacher(resolved, student) -> None:
    """With the student's tokenizer at hand (the data step loads it; as for model_name, a teacher folder is looked
    for then - another config's run may make it): the teacher exists, has the same vocabulary (token -> id) and
    end-of-turn token, and an output layer as wide as the tokenizer."""
    if not resolved.distill:
        return
    from leap_finetune.models.loading import load_tokenizer

    teacher_id, teacher_name = resolved.distill["teacher_id"], resolved.distill["teacher"]
    where = f"{resolved.config_path or 'config'}: teacher"
    if Path(teacher_id).is_absolute() and not Path(teacher_id).exists():
        raise LeapError(
            f"the teacher folder {teacher_id} does not exist",
            where=where,
            fix="a relative path starts at the config file's folder; a teacher another config trains exists once "
            "that run has finished",
        )
    try:
        teacher = load_tokenizer(teacher_id, {})
    except LeapError as err:  # (the tokenizer's own loading errors name model_name)
        raise LeapError(err.message.replace("model_name", "teacher"), where=where, fix=err.fix) from None
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine != theirs:
        differ = sorted(t for t in set(mine) | set(theirs) if mine.get(t) != theirs.get(t))
        shown = ", ".join(f"{t!r}: {mine.get(t)} vs {theirs.get(t)}" for t in differ[:3])
        raise LeapError(
            f"the teacher '{teacher_name}' has another tokenizer than the student ({len(mine):,} vs {len(theirs):,} "
            f"tokens; {len(differ):,} differ, e.g. {shown}): their next-token distributions cannot be compared",
            where=where,
            fix="distil from a teacher of the same family (LFM2 and LFM2.5 models share one tokenizer)",
        )
    if student.eos_token != teacher.eos_token:
        raise LeapError(
            f"the teacher ends a turn with {teacher.eos_token!r} and the student with {student.eos_token!r}",
            where=where,
            fix="distil from a teacher of the same family, with the same chat template",
        )
    width = _output_width(teacher_id)
    if width is not None and width < len(student):
        raise LeapError(
            f"the teacher's output layer scores {width:,} tokens, fewer than the tokenizer's {len(student):,}",
            where=where,
            fix="give a teacher whose vocabulary is the tokenizer's",
        )
    if resolved.distill.get("teacher_base_url"):
        settings = resolved.distill
        config = resolved.config_path or "config"
        _check_server(settings["teacher_base_url"], min(10.0, settings["teacher_timeout_s"]), settings, config)


def _check_server(url: str, timeout_s: float, settings: dict, config: str) -> None:
    """teacher_base_url answers GET /models and serves the teacher (the worker then asks it for a first scoring
    before training; a server the driver starts for teacher_gpus is checked there)."""
    import json
    import urllib.error
    import urllib.request

    url, where = url.rstrip("/"), f"{config}: distill.teacher_base_url"
    fix = (
        "start the server first (vllm serve TEACHER --max-logprobs 20, or python -m leap_finetune.evaluation.serve "
        "TEACHER) and check the URL ends in /v1"
    )
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=timeout_s) as answer:
            models = json.loads(answer.read())
    except urllib.error.HTTPError as err:
        message = f"the teacher server at {url} refused /models with HTTP {err.code}"
        raise LeapError(message, where=where, fix=fix) from None
    except ConnectionRefusedError:
        raise LeapError(f"nothing answers at {url}: the connection was refused", where=where, fix=fix) from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ConnectionRefusedError):
            raise LeapError(f"nothing answers at {url}: the connection was refused", where=where, fix=fix) from None
        message = f"the teacher server at {url} did not answer /models within {timeout_s:g} s ({reason})"
        raise LeapError(message, where=where, fix=fix) from None
    entries = models.get("data", []) if isinstance(models, dict) else []
    served = [entry.get("id") for entry in entries if isinstance(entry, dict)]
    served_teacher_name(url, served, settings["teacher_id"], settings["teacher"], where)


def served_teacher_name(url: str, served: list, teacher_id: str, written: str, where: str = "") -> str:
    """The model name to ask the server for: the one of its /models that is the teacher - the same id, or the same
    last path part (a folder served by path, a Hub id, `--served-model-name` set to the folder's name). A server that
    serves another model is refused: its log-probs would be another model's, with perhaps another tokenizer, and the
    run and its model card would name a teacher it never learnt from."""
    served = [str(name) for name in served if name]
    if not served:
        return teacher_id  # (a server that lists nothing: asked by the teacher's name)

    def short(name: str) -> str:
        return name.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1].lower()

    for name in served:
        if name in (teacher_id, written) or short(name) in (short(teacher_id), short(written)):
            return name
    listed = ", ".join(repr(name) for name in served[:5])
    return _raise(
        LeapError(
            f"the teacher server at {url} serves {listed}, and teacher is '{written}': the run would learn from "
            "another model than the one the config and the model card name",
            where=where or "distill.teacher_base_url",
            fix=f"serve the teacher there (vllm serve {written} --max-logprobs 20, or give it that name with "
            "--served-model-name), or set teacher: to the model the server serves",
        )
    )


def _raise(error: LeapError):
    raise error


def _output_width(model_id: str) -> int | None:
    """config.json's vocab_size (its text model's); None where no config is at hand (checked when the teacher loads)."""
    from leap_finetune.models.registry import config_json

    config = config_json(model_id) or {}
    width = (config.get("text_config") or config).get("vocab_size")
    return width if isinstance(width, int) else None


def _same_weights(student: str, teacher: str) -> bool:
    """Two local folders with byte-equal weights (a copy of the student, a link to it): a teacher of another size is
    told apart by the sizes alone, a fine-tune by sampled chunks, and a copy is read to the end (hashing would read
    every byte of both every time)."""
    import filecmp
    from pathlib import Path

    folders = [Path(student), Path(teacher)]
    try:
        if not all(folder.is_dir() for folder in folders):
            return False
        files = [sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin")) for folder in folders]
        if not files[0] or [p.name for p in files[0]] != [p.name for p in files[1]]:
            return False
        if any(a.stat().st_size != b.stat().st_size for a, b in zip(*files)):
            return False
        pairs = [(a, b) for a, b in zip(*files) if a.resolve() != b.resolve()]
        # a few chunks spread over each file first: a fine-tune whose first tensors did not change (frozen
        # embeddings) differs further in, and is told apart without reading gigabytes on every validate
        return all(_same_samples(a, b) for a, b in pairs) and all(filecmp.cmp(a, b, shallow=False) for a, b in pairs)
    except OSError:  # (a dangling link, a file that cannot be read: loading says what is wrong with it)
        return False


SAMPLE_BYTES = 1 << 18  # (per sampled chunk: 8 of them per file)


def _same_samples(a, b, samples: int = 8) -> bool:
    size = a.stat().st_size
    with open(a, "rb") as left, open(b, "rb") as right:
        for index in range(samples):
            offset = size * index // samples
            left.seek(offset)
            right.seek(offset)
            if left.read(SAMPLE_BYTES) != right.read(SAMPLE_BYTES):
                return False
    return True
