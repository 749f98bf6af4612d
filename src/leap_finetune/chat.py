"""`leap-finetune chat`: talk to a trained model in the terminal (or get one answer with --prompt), with the
chat template the run trained with and its LoRA adapter over the base model. A vision-language model (LFM2-VL)
sees images: `--image FILE` (repeatable) goes with the first message, `/image PATH` with the next one; they go
through the model's processor, which puts each image's tokens where its `<image>` is in the prompt."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from leap_finetune.data.messages import IMAGE_PLACEHOLDER  # (LFM2-VL's processor puts an image's tokens there)
from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS
from leap_finetune.models.trained import TrainedModel, find_trained, unmerged_lora
from leap_finetune.runs.folder import RunFolder

HELP = "/reset starts a new conversation, /exit (or Ctrl-D) ends"
IMAGE_HELP = "/image PATH attaches an image (a file or an http(s) URL) to your next message"


def answer(
    model,
    tokenizer,
    template: str | None,
    messages: list[dict],
    *,
    max_new_tokens: int,
    temperature: float,
    stream=None,
    images: list | None = None,
    processor=None,
) -> str:
    """The model's next turn. `images`: every image of the conversation in order, one per `<image>` in the
    messages' text (a vision-language model's, through its `processor`)."""
    import torch

    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    if images:
        inputs = processor(text=[text], images=[list(images)], add_special_tokens=False, return_tensors="pt")
        inputs = {
            key: value.to(model.device, model.dtype) if value.is_floating_point() else value.to(model.device)
            for key, value in inputs.items()
        }
    else:
        inputs = tokenizer(text, add_special_tokens=False, return_tensors="pt").to(model.device)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            streamer=stream,
            **sampling,
        )
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def refuse_retrieval(source: str, trained: TrainedModel) -> None:
    """An embedding or ColBERT model encodes texts and generates none: loaded as a causal LM it would fail
    or answer nothing, so it is refused before anything loads."""
    kind = trained.retrieval_type()
    if kind is None:
        return
    cls = METHODS[kind].encoder_class
    if trained.adapter_dir is not None:  # (the backbone's LoRA weights alone: the run's model/ has them merged)
        folder, first = str(RunFolder(trained.adapter_dir.parent).model), ""
    elif unmerged_lora(Path(trained.model_id)):
        folder = str(Path(trained.model_id).with_name(Path(trained.model_id).name + "-export"))
        first = f"`leap-finetune export {trained.model_id} --output {folder}` (the adapter merged), then "
    else:
        folder, first = trained.model_id, ""
    raise LeapError(
        f"this is {METHODS[kind].trains}, trained with training_type: {kind}; chat generates text and needs "
        "a causal language model (sft, dpo, kto or grpo)",
        where=source,
        fix=f"{first}encode with sentence-transformers: `from sentence_transformers import {cls}; "
        f'{cls}({folder!r}).encode(["your query"])`, or score it with `leap-finetune eval CONFIG` '
        "(checkpoint: the run folder, evals.benchmarks with metric: retrieval; docs/retrieval.md)",
    )


def refuse_images(source: str, trained: TrainedModel, where: str = "--image") -> None:
    """Images for a text-only model: said before anything loads."""
    raise LeapError(
        f"{trained.name} is a text-only model: it has no vision encoder and cannot see images",
        where=where,
        fix=f"chat with {source} without {where}, or with a vision-language run (model_name: an LFM2-VL model, "
        "e.g. LiquidAI/LFM2-VL-450M, or the built-in tiny-lfm2.5-vl)",
    )


def read_image(path: str, where: str = "--image"):
    """An image file (or http(s) URL) decoded as RGB, or a LeapError that names it."""
    from leap_finetune.models.vision import open_image

    url = path.startswith(("http://", "https://"))
    file = Path(path).expanduser()
    if not url and not file.is_file():
        raise LeapError(
            f"image file not found: {path}" if not file.exists() else f"not an image file but a folder: {path}",
            where=where,
            fix="give the path of an image file (PNG, JPEG, WebP, ...) or an http(s) URL",
        )
    try:
        return open_image(path if url else str(file))
    except Exception as err:  # noqa: BLE001 - PIL's UnidentifiedImageError, a truncated file, a failed download
        said = " ".join(str(err).split()) or type(err).__name__
        raise LeapError(
            f"cannot {'fetch' if url else 'read'} the image {path}: {said[:300]}",
            where=where,
            fix="check the URL and your network, or download the image and give its file"
            if url
            else "give an image file Pillow can decode (PNG, JPEG, WebP, GIF, BMP, ...)",
        ) from None


def _refuse_placeholder(text: str, where: str) -> None:
    if IMAGE_PLACEHOLDER in text:
        raise LeapError(
            f"the message holds {IMAGE_PLACEHOLDER}, the mark where an image's tokens go, without an image for it",
            where=where,
            fix="attach images with --image FILE (or /image PATH in the conversation) and leave "
            f"{IMAGE_PLACEHOLDER} out of the text",
        )


def _user_turn(text: str, images: int) -> dict:
    """A user message whose images come first (as LFM2-VL was trained), each as the processor's placeholder."""
    return {"role": "user", "content": IMAGE_PLACEHOLDER * images + text}


def chat(
    source: str,
    *,
    prompt: str | None = None,
    system: str | None = None,
    images: list[str] | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    console: Console | None = None,
) -> str | None:
    """One answer to `prompt` (returned), or an interactive conversation on the terminal. `images` (files or
    URLs, vision-language models only) go with the prompt, or with the conversation's first message."""
    from leap_finetune.quiet import quiet_libraries

    console = console or Console(stderr=True)
    trained = find_trained(source)
    images = list(images or [])
    vision = _check_before_loading(source, trained, prompt, images)
    opened = [read_image(path) for path in images]  # (every file checked before the model loads)
    # transformers' loading bars, kernel notices and deprecation warnings (peft's, loading an adapter) are not
    # the answer the user asked for (as in `run`)
    quiet_libraries()
    session = _Session(trained, max_new_tokens=max_new_tokens, temperature=temperature)
    start = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        return session.reply(start + [_user_turn(prompt, len(opened))], opened)
    if opened:
        session.processor()  # (a model folder without processor files is said before the conversation starts)
    shown = ", ".join(images)
    console.print(
        f"chatting with {trained.name}"
        + (f"; your first message goes with {shown}" if images else "")
        + f"; {IMAGE_HELP + ', ' if vision else ''}{HELP}",
        markup=False,
    )
    _converse(session, console, source, start, opened, vision)
    return None


def _check_before_loading(source: str, trained: TrainedModel, prompt: str | None, images: list[str]) -> bool:
    """What chat refuses, said before anything loads; whether the model sees images."""
    from leap_finetune.models.vision import is_vision_model, require_torchvision

    refuse_retrieval(source, trained)
    vision = is_vision_model(trained.model_id)
    if images and not vision:
        refuse_images(source, trained)
    if vision and images:
        require_torchvision(trained.model_id)
    if prompt is not None and vision:
        _refuse_placeholder(prompt, "--prompt")
    return vision


class _Session:
    """The loaded model and what each answer needs: its tokenizer, the chat template the run trained with, and a
    vision-language model's processor - loaded when the first image is seen (text-only conversations need no
    torchvision)."""

    def __init__(self, trained: TrainedModel, *, max_new_tokens: int, temperature: float):
        import torch

        self.trained, self.max_new_tokens, self.temperature = trained, max_new_tokens, temperature
        self.model, self.tokenizer = trained.load(dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
        if torch.cuda.is_available():
            self.model = self.model.to("cuda")
        self.template = trained.chat_template(self.tokenizer)
        self._processor = None

    def processor(self):
        if self._processor is None:
            self._processor = self.trained.processor(self.tokenizer, self.template)
        return self._processor

    def reply(self, messages: list[dict], images: list, stream=None) -> str:
        return answer(
            self.model,
            self.tokenizer,
            self.template,
            messages,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            stream=stream,
            images=images,
            processor=self.processor() if images else None,
        )


def _converse(session: _Session, console: Console, source: str, start: list[dict], opened: list, vision: bool):
    """The terminal conversation: each line a user message (with the images attached since the last one), the
    answer streamed; /reset, /image PATH, /exit."""
    from transformers import TextStreamer

    messages, seen, pending = list(start), [], list(opened)
    streamer = TextStreamer(session.tokenizer, skip_prompt=True, skip_special_tokens=True)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            sys.stdout.write("\n")
            return
        command = line.strip()
        if command in ("/exit", "/quit"):
            return
        if command == "/reset":  # a new conversation: the --system message and the --image images again
            messages, seen, pending = list(start), [], list(opened)
        elif command == "/image" or command.startswith("/image "):
            pending += _attach(command.removeprefix("/image").strip().strip("'\""), session, source, vision, console)
        elif command and (not vision or _without_placeholder(line, console)):
            messages.append(_user_turn(line, len(pending)))
            seen, pending = seen + pending, []
            reply = session.reply(messages, seen, stream=streamer)
            messages.append({"role": "assistant", "content": reply})


def _attach(path: str, session: _Session, source: str, vision: bool, console: Console) -> list:
    """`/image PATH`: [the image] for the next message, or [] with the reason said (the conversation goes on)."""
    try:
        if not vision:
            refuse_images(source, session.trained, where="/image")
        if not path:
            raise LeapError("no image given", where="/image", fix="/image PATH (a file or an http(s) URL)")
        image = read_image(path, where="/image")
        session.processor()
    except LeapError as err:
        console.print(f"error: {err.format()}", markup=False)
        return []
    console.print(f"attached {path} (it goes with your next message)", markup=False)
    return [image]


def _without_placeholder(line: str, console: Console) -> bool:
    """A message without `<image>` typed in it; otherwise the error is said and the message not sent."""
    try:
        _refuse_placeholder(line, "your message")
    except LeapError as err:
        console.print(f"error: {err.format()}", markup=False)
        return False
    return True
