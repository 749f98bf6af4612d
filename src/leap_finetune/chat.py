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
from leap_finetune.models.trained import chat_template_text, find_trained, load_trained, retrieval_type, unmerged_lora
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


def refuse_retrieval(source: str, trained) -> None:
    """An embedding or ColBERT model encodes texts and generates none: loaded as a causal LM it would fail
    or answer nothing, so it is refused before anything loads."""
    kind = retrieval_type(trained)
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


def refuse_images(source: str, trained, where: str = "--image") -> None:
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


def trained_processor(trained, tokenizer, template: str | None):
    """The processor of a vision-language model, sharing the tokenizer (and the chat template) chat renders
    with. A training checkpoint holds no processor files: fine-tuning does not change how images are prepared,
    so the base model's processor (the run's model_id) is used, with the run's `image_processor:` settings (what
    its model/ is saved with). An adapter's base is that base model too."""
    from leap_finetune.models.vision import has_processor_files, load_processor

    source, settings = trained.model_id, None
    if trained.adapter_dir is not None or not has_processor_files(source):
        recorded = (trained.run_config or {}).get("image_processor")
        settings = {k: v for k, v in recorded.items() if v is not None} if isinstance(recorded, dict) else None
    if not has_processor_files(source):
        base = (trained.run_config or {}).get("model_id")
        if not base or not has_processor_files(base):
            raise LeapError(
                "the folder has no processor files (processor_config.json / preprocessor_config.json): the "
                "images cannot be prepared for the model",
                where=source,
                fix="give the run folder (its model/ is saved with its processor), or copy the base model's "
                "processor_config.json (or preprocessor_config.json) into the folder",
            )
        source = base
    processor = load_processor(source, tokenizer, settings) if settings else load_processor(source, tokenizer)
    if template:
        processor.chat_template = template
    return processor


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
    import torch

    from leap_finetune.models.vision import is_vision_model
    from leap_finetune.quiet import quiet_libraries

    console = console or Console(stderr=True)
    trained = find_trained(source)
    refuse_retrieval(source, trained)
    vision = is_vision_model(trained.model_id)
    images = list(images or [])
    if images and not vision:
        refuse_images(source, trained)
    if vision and images:
        from leap_finetune.models.vision import require_torchvision

        require_torchvision(trained.model_id)
    if prompt is not None and vision:
        _refuse_placeholder(prompt, "--prompt")
    opened = [read_image(path) for path in images]  # (every file checked before the model loads)
    # transformers' loading bars, kernel notices and deprecation warnings (peft's, loading an adapter) are not
    # the answer the user asked for (as in `run`)
    quiet_libraries()
    model, tokenizer = load_trained(trained, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    if torch.cuda.is_available():
        model = model.to("cuda")
    template = chat_template_text(trained, tokenizer)
    processors: list = []  # loaded when the first image is seen (text-only conversations need no torchvision)

    def processor():
        if not processors:
            processors.append(trained_processor(trained, tokenizer, template))
        return processors[0]

    start = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        return answer(
            model,
            tokenizer,
            template,
            start + [_user_turn(prompt, len(opened))],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            images=opened,
            processor=processor() if opened else None,
        )
    from transformers import TextStreamer

    if opened:
        processor()  # (a model folder without processor files is said before the conversation starts)
    shown = ", ".join(images)
    console.print(
        f"chatting with {trained.name}"
        + (f"; your first message goes with {shown}" if images else "")
        + f"; {IMAGE_HELP + ', ' if vision else ''}{HELP}",
        markup=False,
    )
    messages, seen, pending = list(start), [], list(opened)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            sys.stdout.write("\n")
            return None
        command = line.strip()
        if command in ("/exit", "/quit"):
            return None
        if command == "/reset":  # a new conversation: the --system message and the --image images again
            messages, seen, pending = list(start), [], list(opened)
            continue
        if command == "/image" or command.startswith("/image "):
            path = command.removeprefix("/image").strip().strip("'\"")
            try:
                if not vision:
                    refuse_images(source, trained, where="/image")
                if not path:
                    raise LeapError("no image given", where="/image", fix="/image PATH (a file or an http(s) URL)")
                image = read_image(path, where="/image")
                processor()
                pending.append(image)
            except LeapError as err:
                console.print(f"error: {err.format()}", markup=False)
                continue
            console.print(f"attached {path} (it goes with your next message)", markup=False)
            continue
        if not command:
            continue
        if vision:
            try:
                _refuse_placeholder(line, "your message")
            except LeapError as err:
                console.print(f"error: {err.format()}", markup=False)
                continue
        messages.append(_user_turn(line, len(pending)))
        seen, pending = seen + pending, []
        reply = answer(
            model,
            tokenizer,
            template,
            messages,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stream=streamer,
            images=seen,
            processor=processor() if seen else None,
        )
        messages.append({"role": "assistant", "content": reply})
