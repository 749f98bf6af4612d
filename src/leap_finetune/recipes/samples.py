"""The sample answers printed before and after training (SFT): a few held-out prompts the driver picked
(prepared/samples.json), answered greedily by the model, beside the expected answer."""

from __future__ import annotations

import json
from pathlib import Path

from leap_finetune.runs.folder import RunFolder


def load_samples(run_dir: Path) -> list[dict]:
    path = RunFolder(run_dir).samples
    return json.loads(path.read_text()) if path.exists() else []


def print_samples(console, when: str, model, tokenizer, samples: list[dict], processor=None) -> None:
    """`processor`: a vision-language model's, for samples with pictures."""
    import torch

    was_training = model.training
    model.eval()
    console.print(f"[bold]sample answers {when}[/bold]")
    device = next(model.parameters()).device
    for sample in samples:
        if sample.get("images") and processor is not None:
            from leap_finetune.evaluation.generation import generate

            with torch.compiler.set_stance("force_eager"):
                answer = generate(
                    model,
                    tokenizer,
                    [sample["prompt"]],
                    max_new_tokens=sample.get("max_new_tokens", 64),
                    batch_size=1,
                    images=[sample["images"]],
                    processor=processor,
                )[0]
            console.print(
                f"  Q: [{len(sample['images'])} image(s)] {sample['question']}\n     model: {answer!r}   "
                f"expected: {sample['reference']!r}",
                markup=False,
                highlight=False,
            )
            continue
        ids = tokenizer(sample["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):  # compiled layers: training shapes only
            out = model.generate(
                ids,
                max_new_tokens=sample.get("max_new_tokens", 64),
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
        # Special tokens stay visible (tool-call markers are part of the answer); generation stops at eos.
        new = out[0, ids.shape[1] :].tolist()
        if tokenizer.eos_token_id in new:
            new = new[: new.index(tokenizer.eos_token_id)]
        answer = tokenizer.decode([t for t in new if t != tokenizer.pad_token_id]).strip()
        console.print(
            f"  Q: {sample['question']}\n     model: {answer!r}   expected: {sample['reference']!r}",
            markup=False,
            highlight=False,
        )
    if was_training:
        model.train()
