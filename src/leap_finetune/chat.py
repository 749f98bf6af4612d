"""`leap-finetune chat`: talk to a trained model in the terminal (or get one answer with --prompt), with the
chat template the run trained with and its LoRA adapter over the base model."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS
from leap_finetune.models.trained import chat_template_text, find_trained, load_trained, retrieval_type, unmerged_lora
from leap_finetune.runs.folder import RunFolder

HELP = "/reset starts a new conversation, /exit (or Ctrl-D) ends"


def answer(
    model,
    tokenizer,
    template: str | None,
    messages: list[dict],
    *,
    max_new_tokens: int,
    temperature: float,
    stream=None,
) -> str:
    import torch

    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
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


def chat(
    source: str,
    *,
    prompt: str | None = None,
    system: str | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    console: Console | None = None,
) -> str | None:
    """One answer to `prompt` (returned), or an interactive conversation on the terminal."""
    import torch
    import transformers

    console = console or Console(stderr=True)
    trained = find_trained(source)
    refuse_retrieval(source, trained)
    # transformers' loading bars and kernel notices are not the answer the user asked for (as in `run`)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model, tokenizer = load_trained(trained, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    if torch.cuda.is_available():
        model = model.to("cuda")
    template = chat_template_text(trained, tokenizer)
    start = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        return answer(
            model,
            tokenizer,
            template,
            start + [{"role": "user", "content": prompt}],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
    from transformers import TextStreamer

    console.print(f"chatting with {trained.name}; {HELP}", markup=False)
    messages = list(start)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            sys.stdout.write("\n")
            return None
        if line.strip() in ("/exit", "/quit"):
            return None
        if line.strip() == "/reset":
            messages = list(start)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = answer(
            model,
            tokenizer,
            template,
            messages,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stream=streamer,
        )
        messages.append({"role": "assistant", "content": reply})
