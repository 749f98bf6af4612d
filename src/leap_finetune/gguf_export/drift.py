"""How far each GGUF file's predictions moved from the original's, token by token: a small benchmark's accuracy
moves in whole rows (8 rows: steps of 0.125) and stays flat until an answer flips, while the next-token
distributions move with every rounded weight. Measured over the benchmark rows' answers (the reference answer, or
the correct option), fed as the same token ids to both models:

    kl    mean KL(original || file) per answer token, in nats (0: the same distributions)
    top1  how often the file's most likely next token is the original's (1.0: every one)
"""

from __future__ import annotations

from pathlib import Path

# answers of the first ROWS benchmark rows: enough tokens for a stable mean, a bounded cost on a CPU
ROWS = 64


def answer_ids(resolved, tokenizer, rows: int = ROWS) -> list[tuple[list[int], int]]:
    """(token ids of prompt + answer, where the answer starts) for the first `rows` benchmark rows."""
    from leap_finetune.evaluation.runner import load_benchmarks

    found = []
    for bench in load_benchmarks(resolved.evals, vision=False, model_name=resolved.model_name):
        for item in bench.items:
            answer = item.reference if item.reference is not None else (item.options or [None])[item.answer_id or 0]
            if answer is None or item.images:
                continue
            prompt = tokenizer.apply_chat_template(item.prompt, add_generation_prompt=True, tokenize=False)
            full = tokenizer.apply_chat_template(
                item.prompt + [{"role": "assistant", "content": answer}], tokenize=False
            )
            if not full.startswith(prompt):  # (a template that rewrites earlier turns: no clean answer span)
                continue
            ids = tokenizer(full, add_special_tokens=False).input_ids
            start = len(tokenizer(prompt, add_special_tokens=False).input_ids)
            if start < len(ids):
                found.append((ids, start))
            if len(found) == rows:
                return found
    return found


def _answer_log_probs(model, rows) -> list:
    """Per row, the log-probabilities of every next token over the answer positions (float32, on the CPU)."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for ids, start in rows:
            logits = model(torch.tensor([ids], device=device)).logits[0, start - 1 : len(ids) - 1].float()
            out.append(torch.log_softmax(logits, dim=-1).cpu())
    return out


def drift(resolved, original: Path, files: dict[str, Path], readable: set[str]) -> dict[str, dict[str, float]]:
    """{type: {"kl": ..., "top1": ...}} for each readable file, against the original transformers folder."""
    import torch

    from leap_finetune.models.gguf import load_gguf
    from leap_finetune.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(original))
    rows = answer_ids(resolved, tokenizer)
    if not rows:
        return {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(str(original), tokenizer, dtype=torch.float32).to(device).eval()
    reference = _answer_log_probs(model, rows)
    del model
    result = {}
    for label, path in files.items():
        if label not in readable:
            continue
        model = load_gguf(path)[0].to(device)
        kl_sum, tokens, same = 0.0, 0, 0
        for ref, got in zip(reference, _answer_log_probs(model, rows)):
            kl_sum += float((ref.exp() * (ref - got)).sum())
            tokens += ref.shape[0]
            same += int((ref.argmax(-1) == got.argmax(-1)).sum())
        del model
        result[label] = {"kl": max(kl_sum / tokens, 0.0), "top1": same / tokens, "tokens": tokens}
    return result
