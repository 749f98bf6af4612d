"""A vision-language model after training (issue #27): `chat --image` and `/image` show it images through its
processor, the model card's snippet asks it about an image and runs, and `export` (full, LoRA merged or not) keeps
the processor: the folder loads with AutoProcessor and AutoModelForImageTextToText and answers about an image.

Two short runs of tiny-lfm2.5-vl (examples/vl_quickstart.yaml with --set: a few steps, no benchmarks), a full
fine-tune and a LoRA one, shared by the module."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console

from tests.conftest import EXAMPLES, invoke

IMAGES = EXAMPLES / "data" / "images"
BANANA, CHERRY = str(IMAGES / "banana.png"), str(IMAGES / "cherry.png")
QUESTION = "What fruit is this?"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("vl")
    examples = Path(shutil.copytree(EXAMPLES, folder / "examples", ignore=shutil.ignore_patterns("outputs")))
    short = [
        "--set",
        "evals.benchmarks=[]",
        "--set",
        "samples=0",
        "--set",
        "training_config.max_steps=4",
        "--set",
        "training_config.save_steps=2",
    ]
    for name, extra in (("full", []), ("lora", ["--set", "peft_config={extends: DEFAULT_LORA, r: 8}"])):
        result = invoke(
            str(examples / "vl_quickstart.yaml"), *short, "--set", f"project_name=vl_{name}", *extra, cwd=folder
        )
        assert result.returncode == 0, result.stderr[-3000:]
    [full] = list((examples / "outputs" / "vl_full").iterdir())
    [lora] = list((examples / "outputs" / "vl_lora").iterdir())
    assert (full / "model" / "processor_config.json").is_file() and (lora / "adapter" / "adapter_config.json").is_file()
    return {"full": full, "lora": lora, "folder": folder}


@pytest.fixture
def generate_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every generate of LFM2-VL (through PeftModel too)."""
    from transformers import Lfm2VlForConditionalGeneration

    calls, original = [], Lfm2VlForConditionalGeneration.generate

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Lfm2VlForConditionalGeneration, "generate", spy)
    return calls


def image_starts(call: dict) -> int:
    from leap_finetune.models.tiny import load_tiny_tokenizer

    start = load_tiny_tokenizer("tiny-lfm2.5-vl").convert_tokens_to_ids("<|image_start|>")
    return int((call["input_ids"] == start).sum())


def ask(folder: Path, images: list[str], *, processor_from: Path | None = None, max_new_tokens: int = 6):
    """As the model card says: AutoModelForImageTextToText, AutoProcessor, a message with image parts and a
    question. (inputs, logits of the prompt, decoded answer)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.image_utils import load_image

    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(processor_from or folder)
    parts = [{"type": "image", "image": load_image(path)} for path in images]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = model(**inputs).logits
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    answer = processor.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    return inputs, logits, answer


# ---- chat --image


def test_chat_prompt_with_images_goes_through_the_processor(runs, generate_calls):
    result = invoke("chat", str(runs["full"]), "--image", BANANA, "--prompt", QUESTION, "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr
    [call] = generate_calls
    assert call["pixel_values"].shape[0] == 1 and image_starts(call) == 1
    # the same prompt, image tokens and answer as the model card's way (AutoProcessor.apply_chat_template)
    inputs, _, expected = ask(runs["full"] / "model", [BANANA])
    assert torch.equal(call["input_ids"].cpu(), inputs["input_ids"])
    assert torch.equal(call["pixel_values"].cpu(), inputs["pixel_values"])
    assert result.stdout == expected + "\n"
    # without an image: the text alone, as for a text model
    generate_calls.clear()
    text = invoke("chat", str(runs["full"]), "--prompt", QUESTION, "--max-new-tokens", "3")
    assert text.returncode == 0, text.stderr
    [call] = generate_calls
    assert "pixel_values" not in call and image_starts(call) == 0

    # --image repeated (-i), over a LoRA checkpoint (an adapter: the base model's processor)
    generate_calls.clear()
    two = invoke(
        "chat", str(runs["lora"] / "checkpoint-2"), "-i", BANANA, "-i", CHERRY, "-p", QUESTION, "--max-new-tokens", "3"
    )
    assert two.returncode == 0, two.stderr
    [call] = generate_calls
    assert call["pixel_values"].shape[0] == 2 and image_starts(call) == 2


def test_chat_image_mistakes_are_said_before_the_model_loads(workdir):
    text_only = invoke("chat", "tiny-lfm2", "--image", BANANA, "--prompt", "hi")
    assert text_only.returncode == 2 and "tiny-lfm2 is a text-only model" in text_only.stderr, text_only.stderr
    assert "--image" in text_only.stderr and "fix:" in text_only.stderr
    missing = invoke("chat", "tiny-lfm2.5-vl", "--image", "nowhere/cat.png", "--prompt", "hi")
    assert missing.returncode == 2 and "image file not found: nowhere/cat.png" in missing.stderr, missing.stderr
    (workdir / "broken.png").write_text("not an image")
    broken = invoke("chat", "tiny-lfm2.5-vl", "--image", "broken.png", "--prompt", "hi")
    assert broken.returncode == 2 and "cannot read the image broken.png" in broken.stderr, broken.stderr
    folder = invoke("chat", "tiny-lfm2.5-vl", "--image", str(workdir), "--prompt", "hi")
    assert folder.returncode == 2 and "not an image file but a folder" in folder.stderr
    placeholder = invoke("chat", "tiny-lfm2.5-vl", "--prompt", "What is <image>?")
    assert placeholder.returncode == 2 and "--prompt" in placeholder.stderr and "<image>" in placeholder.stderr


def test_interactive_chat_attaches_images(runs, generate_calls, monkeypatch, capsys):
    """--image goes with the first message; /image PATH with the next one (a bad path is said, the conversation
    goes on); every image of the conversation goes with every turn; /reset starts again with --image's."""
    from leap_finetune.chat import chat

    lines = iter(["Describe it.", "/image nowhere.png", "/image", f"/image {CHERRY}", "And this?", "/reset", "Again?"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))  # (StopIteration ends it: as Ctrl-D)
    said = io.StringIO()
    with pytest.raises(StopIteration):
        chat(str(runs["full"]), images=[BANANA], max_new_tokens=3, console=Console(file=said, width=200))
    shown = " ".join(said.getvalue().split())
    assert "your first message goes with" in shown and "/image PATH attaches an image" in shown
    assert "image file not found: nowhere.png" in shown and "/image: no image given" in shown
    assert f"attached {CHERRY}" in shown
    assert [image_starts(call) for call in generate_calls] == [1, 2, 1]
    assert [call["pixel_values"].shape[0] for call in generate_calls] == [1, 2, 1]
    capsys.readouterr()

    # a text-only model: /image is refused with the reason, the conversation goes on
    generate_calls.clear()
    lines = iter([f"/image {BANANA}", "/exit"])
    said = io.StringIO()
    assert chat("tiny-lfm2", max_new_tokens=2, console=Console(file=said, width=200)) is None
    shown = " ".join(said.getvalue().split())
    assert "/image: tiny-lfm2 is a text-only model" in shown and "/image PATH" not in shown


# ---- the model card


def test_the_model_cards_snippets_ask_about_an_image_and_run(runs):
    """The card of a full run's model/, a LoRA run's adapter/ and its merged model/: image-text-to-text, a snippet
    with AutoProcessor and an image part that runs (the example image, a URL, replaced by a local file: this
    machine has no network) and prints an answer."""
    from huggingface_hub import ModelCard

    from leap_finetune.launch.reports.model_card import EXAMPLE_IMAGE

    for kind, folder in (("full", "model"), ("lora", "adapter"), ("lora", "model")):
        card = ModelCard.load(runs[kind] / folder / "README.md")
        assert card.data.pipeline_tag == "image-text-to-text"
        assert f"leap-finetune chat {runs[kind]} --image IMAGE" in card.text
        [code] = re.findall(r"```python\n(.*?)```", card.text, re.S)
        for part in (
            "AutoProcessor" if folder == "model" else "load_processor",  # (the tiny base is built, not downloaded)
            '{"type": "image", "image": image}',
            'add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"',
            "model.generate(",
            "processor.decode(",
        ):
            assert part in code, (kind, folder, part)
        assert ("AutoModelForImageTextToText.from_pretrained" in code) == (folder == "model")
        assert ("PeftModel" in code) == (folder == "adapter")
        assert EXAMPLE_IMAGE in code
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace(EXAMPLE_IMAGE, BANANA), "model card snippet", "exec"), {})  # noqa: S102
        assert out.getvalue().endswith("\n"), (kind, folder)  # it printed the model's answer


def test_the_card_asks_about_a_benchmark_image_and_an_adapter_keeps_the_image_settings():
    from leap_finetune.launch.reports.model_card import EXAMPLE_IMAGE, snippet
    from leap_finetune.validate.loader import load_config

    resolved = load_config(EXAMPLES / "vl_quickstart.yaml")
    summary = {"model_dir": "/runs/x/model", "adapter_dir": "/runs/x/adapter"}
    code = snippet(resolved, summary, False)
    assert f'load_image("{IMAGES / "banana.png"}")' in code and EXAMPLE_IMAGE not in code  # runs as pasted here
    if not hasattr(resolved, "image_processor"):  # (image_processor: settings, where this release has them)
        return
    resolved = load_config(EXAMPLES / "vl_quickstart.yaml", overrides=["image_processor={max_image_tokens: 8}"])
    assert "load_processor(\"tiny-lfm2.5-vl\", tokenizer, {'max_image_tokens': 8})" in snippet(resolved, summary, True)
    resolved.model_id = "LiquidAI/LFM2-VL-450M"
    assert 'AutoProcessor.from_pretrained("LiquidAI/LFM2-VL-450M", max_image_tokens=8)' in snippet(
        resolved, summary, True
    )


# ---- export


def test_export_keeps_the_processor_full_and_lora(runs):
    folder = runs["folder"]
    exports = {
        "lora-merged": (runs["lora"] / "checkpoint-4", ["--merge"]),  # base + adapter, merged
        "full-run": (runs["full"], []),  # the run's model/ (saved with its processor)
        "full-checkpoint": (runs["full"] / "checkpoint-2", ["--merge"]),  # no processor files: the base's
        "lora-adapter": (runs["lora"] / "checkpoint-4", []),  # the adapter as it is, with the processor
    }
    for name, (source, options) in exports.items():
        result = invoke("export", str(source), *options, "--output", str(folder / name))
        assert result.returncode == 0, result.stderr
        assert (folder / name / "processor_config.json").is_file(), name
        said = " ".join(result.stderr.split())
        assert ("with its processor" in said) and ("vision-language" in said) == (name != "lora-adapter"), said

    # the merged LoRA checkpoint (the last step) is the run's merged model/: same inputs, same logits
    inputs, logits, answer = ask(folder / "lora-merged", [BANANA, CHERRY])
    reference_inputs, reference, _ = ask(runs["lora"] / "model", [BANANA, CHERRY])
    assert torch.equal(inputs["input_ids"], reference_inputs["input_ids"])
    assert torch.equal(inputs["pixel_values"], reference_inputs["pixel_values"])
    assert torch.allclose(logits, reference, atol=1e-4), (logits - reference).abs().max()
    assert isinstance(answer, str)
    # a full run's folder and a checkpoint of it (its processor taken from the base model, tiny-lfm2.5-vl)
    _, logits, _ = ask(folder / "full-run", [BANANA])
    _, reference, _ = ask(runs["full"] / "model", [BANANA])
    assert torch.allclose(logits, reference, atol=1e-5)
    _, logits, _ = ask(folder / "full-checkpoint", [BANANA])
    _, reference, _ = ask(runs["full"] / "checkpoint-2", [BANANA], processor_from=runs["full"] / "model")
    assert torch.allclose(logits, reference, atol=1e-5)
    # the adapter export: its processor loads; the adapter goes over the base model
    from peft import PeftModel
    from transformers import AutoProcessor

    from leap_finetune.models.loading import load_model
    from leap_finetune.models.tiny import load_tiny_tokenizer

    processor = AutoProcessor.from_pretrained(folder / "lora-adapter")
    assert type(processor).__name__ == "Lfm2VlProcessor" and "<|im_start|>" in processor.chat_template
    base = load_model("tiny-lfm2.5-vl", load_tiny_tokenizer("tiny-lfm2.5-vl"))
    PeftModel.from_pretrained(base, str(folder / "lora-adapter"))
