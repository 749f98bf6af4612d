"""`leap-finetune inspect`'s rows on the terminal: one function per kind of row, trained text highlighted."""

from __future__ import annotations

from rich.console import Console

TRAINED_STYLE = "bold green on grey15"


def show_prompt_row(console: Console, item: dict) -> None:
    """grpo: the model generates the completions during training; the prompt is not trained."""
    from rich.text import Text

    console.rule(
        f"row {item['row']}  ({item['source']['file']}, {item['source']['location']}; "
        f"{item['prompt_tokens']} prompt tokens)"
    )
    console.print(Text("prompt (as the model sees it; completions are generated during training)", style="bold"))
    console.print(Text(item["prompt"]))
    console.print(Text(f"solution: {item['solution']}" if item["solution"] is not None else "no solution"))
    for name, value in (item.get("columns") or {}).items():
        console.print(Text(f"{name}: {value}"))


def show_retrieval_row(console: Console, item: dict) -> None:
    """embedding / colbert: each text as the encoder reads it (prompts included)."""
    from rich.text import Text

    for name, value in [("query", item["query"]), ("positive", item["positive"])] + [
        (f"negative {i + 1}", text) for i, text in enumerate(item["negatives"])
    ]:
        console.print(Text(f"{name}: ", style="bold") + Text(value))
    if item["unused_negatives"]:
        console.print(
            Text(f"({item['unused_negatives']} more negative(s) not used: rows have different numbers of negatives)")
        )
    if item["truncated"]:
        console.print(Text("(cut to retrieval.query_max_length / document_max_length)"))


def show_conversation(console: Console, item: dict) -> None:
    """sft: one conversation, trained spans highlighted, what max_length cuts struck through, then its images."""
    from rich.text import Text

    text = Text(item["text"])
    for start, end in item["trained_spans"]:
        text.stylize(TRAINED_STYLE, start, end)
    if item.get("truncated_at") is not None:
        text.stylize("strike dim", item["truncated_at"], len(item["text"]))
    console.print(text)
    for number, image in enumerate(item.get("images") or [], start=1):  # each <image> above, in order
        console.print(
            Text(
                f"<image> {number}: {image['image']} ({image['size']} pixels) -> {image['tiles']} tile(s), "
                f"{image['tokens']} tokens (no loss)",
                style="cyan",
            )
        )


def show_preference_row(console: Console, item: dict) -> None:
    """dpo / kto: the prompt, then each completion (all of a completion is trained)."""
    from rich.text import Text

    console.print(
        Text("prompt" + (" (shared by chosen and rejected)" if item.get("implicit_prompt") else ""), style="bold")
    )
    console.print(Text(item["prompt"]))
    for name in ("chosen", "rejected", "completion"):
        if name in item:
            label = f" (label: {'desirable' if item['label'] else 'undesirable'})" if "label" in item else ""
            console.print(Text(f"{name}{label}", style="bold"))
            console.print(Text(item[name], style=TRAINED_STYLE))
