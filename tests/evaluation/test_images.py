"""Benchmark rows with images through a real LFM2-VL architecture (tiny-lfm2.5-vl) and its processor:
scores equal a direct computation, the image changes the score, batched == one at a time, and
standalone evaluation runs from the spec's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from leap_finetune.api import evaluate_config
from leap_finetune.data.chat_templates import load_chat_template
from leap_finetune.data.render import Renderer
from leap_finetune.errors import LeapError
from leap_finetune.evaluation.generation import generate
from leap_finetune.evaluation.logprob import option_sequences, score_sequences
from leap_finetune.models.tiny import (
    build_tiny_model,
    build_tiny_processor,
    load_tiny_tokenizer,
)
from leap_finetune.models.vision import is_vision_model, require_torchvision

MODEL = "tiny-lfm2.5-vl"


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    paths = {}
    for name, color, size in (
        ("red", (220, 20, 20), (48, 40)),
        ("blue", (20, 20, 220), (64, 64)),
        ("stripes", None, (80, 30)),
    ):
        image = Image.new("RGB", size, color or (0, 0, 0))
        if color is None:
            for x in range(0, size[0], 8):
                image.paste((255, 255, 255), (x, 0, x + 4, size[1]))
        image.save(folder / f"{name}.png")
        paths[name] = str(folder / f"{name}.png")
    tokenizer = load_tiny_tokenizer(MODEL)
    model = build_tiny_model(MODEL, tokenizer).eval()
    processor = build_tiny_processor(tokenizer)
    renderer = Renderer(tokenizer, load_chat_template("lfm2.5", tokenizer), "all", None)
    return tokenizer, model, processor, renderer, paths


def ask(question: str, image: bool = True) -> list[dict]:
    return [{"role": "user", "content": ("<image>" if image else "") + question}]


def direct_logprob(model, processor, text: str, option: str, image_path: str) -> float:
    """Independent of leap-finetune's scoring: the processor encodes prompt and prompt + option,
    one forward pass, the option's log-probabilities summed."""
    image = Image.open(image_path).convert("RGB")
    prompt = processor(text=[text], images=[[image]], return_tensors="pt")
    full = processor(text=[text + option], images=[[image]], return_tensors="pt")
    start = prompt["input_ids"].shape[1]
    assert torch.equal(full["input_ids"][0, :start], prompt["input_ids"][0])
    with torch.no_grad():
        logits = model(**full).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    ids = full["input_ids"][0]
    return sum(logprobs[i - 1, ids[i]].item() for i in range(start, len(ids)))


def test_tiny_vl_model_is_recognised_and_its_processor_expands_images(vl):
    tokenizer, model, processor, renderer, paths = vl
    assert is_vision_model(MODEL) and not is_vision_model("tiny-lfm2.5")
    text = renderer.prompt_text(ask("What color?"))
    inputs = processor(text=[text], images=[[Image.open(paths["blue"])]], return_tensors="pt")
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    assert (inputs["input_ids"] == image_id).sum() >= 4  # one <image> became the image's tokens
    assert model.config.image_token_id == image_id
    assert inputs["pixel_values"].shape[0] == 1


def test_image_option_scores_equal_a_direct_computation_and_depend_on_the_image(vl):
    tokenizer, model, processor, renderer, paths = vl
    prompt = ask("What color is this square?")
    options = ["red", "blue", "a kind of green"]
    text = renderer.prompt_text(prompt)
    scores = {}
    for name in ("red", "blue"):
        sequences = option_sequences(renderer, prompt, options, [paths[name]])
        scores[name] = score_sequences(
            model, sequences, batch_size=8, pad_id=tokenizer.pad_token_id, processor=processor
        )
        for option, score in zip(options, scores[name]):
            assert score == pytest.approx(direct_logprob(model, processor, text, option, paths[name]), abs=1e-4)
    # the pixels reach the model: another image gives other scores for the same text
    assert max(abs(a - b) for a, b in zip(scores["red"], scores["blue"])) > 1e-4


def test_batched_image_and_text_rows_score_as_one_at_a_time(vl):
    tokenizer, model, processor, renderer, paths = vl
    questions = [
        (ask("Which color?"), ["red", "blue"], [paths["red"]]),
        (ask("Is it striped?", image=False), ["yes", "no, it is plain"], []),
        (ask("Which pattern?"), ["stripes", "dots", "plain"], [paths["stripes"]]),
        (
            [{"role": "user", "content": "<image>Compare with <image>"}],
            ["same", "different"],
            [paths["blue"], paths["red"]],
        ),
    ]
    sequences = [
        seq for prompt, options, images in questions for seq in option_sequences(renderer, prompt, options, images)
    ]
    one_by_one = [
        score_sequences(model, [seq], batch_size=1, pad_id=tokenizer.pad_token_id, processor=processor)[0]
        for seq in sequences
    ]
    for batch_size in (3, 16):
        batched = score_sequences(
            model, sequences, batch_size=batch_size, pad_id=tokenizer.pad_token_id, processor=processor
        )
        assert batched == pytest.approx(one_by_one, abs=1e-4)


def test_batched_generation_with_images_equals_one_at_a_time(vl):
    tokenizer, model, processor, renderer, paths = vl
    prompts = [
        renderer.prompt_text(ask("Describe it.")),
        renderer.prompt_text(ask("Hello there", image=False)),
        renderer.prompt_text(ask("And this one, in a few more words?")),
    ]
    images = [[paths["red"]], [], [paths["stripes"]]]
    alone = [
        generate(model, tokenizer, [p], max_new_tokens=6, batch_size=1, images=[i], processor=processor)[0]
        for p, i in zip(prompts, images)
    ]
    together = generate(model, tokenizer, prompts, max_new_tokens=6, batch_size=3, images=images, processor=processor)
    assert together == alone
    assert all(isinstance(text, str) for text in together)


def test_standalone_eval_of_a_vision_model_on_image_benchmarks(vl, tmp_path):
    *_, paths = vl
    gen_rows = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": paths[name]}, {"type": "text", "text": "What is shown?"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": f"A {name} picture."}]},
            ]
        }
        for name in ("red", "blue", "stripes")
    ]
    mcq_rows = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": paths[name]}, {"type": "text", "text": "Which one?"}],
                }
            ],
            "options": ["red", "blue", "stripes"],
            "answer_id": answer,
        }
        for answer, name in enumerate(("red", "blue", "stripes"))
    ]
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gen_rows))
    (tmp_path / "mcq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mcq_rows))
    config = {
        "model_name": MODEL,
        "evals": {
            "max_new_tokens": 5,
            "batch_size": 2,
            "benchmarks": [
                {"name": "describe", "path": str(tmp_path / "gen.jsonl"), "metric": "exact_match"},
                {"name": "which", "path": str(tmp_path / "mcq.jsonl"), "metric": "logprob_mcq"},
            ],
        },
    }
    (tmp_path / "eval.yaml").write_text(json.dumps(config))
    report = evaluate_config(tmp_path / "eval.yaml", output=tmp_path / "out" / "results.json")
    results = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert results == report["results"]
    assert results["benchmark/describe/rows"] == 3 and results["benchmark/which/rows"] == 3
    predictions = [
        json.loads(line) for line in (tmp_path / "out" / "results.predictions" / "which.jsonl").read_text().splitlines()
    ]
    assert [len(p["option_logprobs"]) for p in predictions] == [3, 3, 3]
    # the same question about different images gets different option scores: the images were used
    assert predictions[0]["option_logprobs"] != predictions[1]["option_logprobs"]
    assert "<image>" in predictions[0]["prompt"]


def test_missing_torchvision_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` now raises ImportError
    with pytest.raises(LeapError) as err:
        require_torchvision(MODEL)
    assert "torchvision" in str(err.value) and "pip install torchvision" in err.value.fix


def test_image_root_is_where_benchmark_image_paths_start(vl, tmp_path):
    """evals.image_root (and a benchmark's own, which wins): relative image paths of benchmark rows start there,
    not at the benchmark file's folder; a folder that is not there is said at validate."""
    from leap_finetune.evaluation.runner import load_benchmarks
    from leap_finetune.validate.loader import load_config

    *_, paths = vl
    folder = Path(paths["red"]).parent
    row = {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                     {"type": "text", "text": "What colour?"}]},
                        {"role": "assistant", "content": "red"}]}  # fmt: skip
    (tmp_path / "gen.jsonl").write_text(json.dumps(row) + "\n")
    bench = {"name": "colour", "path": "gen.jsonl", "metric": "exact_match"}
    config = {"model_name": MODEL, "evals": {"image_root": str(folder), "benchmarks": [bench]}}
    (tmp_path / "eval.yaml").write_text(json.dumps(config))
    resolved = load_config(tmp_path / "eval.yaml")
    [loaded] = load_benchmarks(resolved.evals, vision=True, model_name=MODEL)
    assert loaded.items[0].images == [str(folder / "red.png")]
    (tmp_path / "eval.yaml").write_text(json.dumps({**config, "evals": {"benchmarks": [bench]}}))
    with pytest.raises(LeapError, match="red.png"):  # from the file's folder: not there
        load_benchmarks(load_config(tmp_path / "eval.yaml").evals, vision=True, model_name=MODEL)
    own = {**bench, "image_root": "pictures"}
    (tmp_path / "eval.yaml").write_text(
        json.dumps({**config, "evals": {"image_root": str(folder), "benchmarks": [own]}})
    )
    with pytest.raises(LeapError, match="image_root is not a folder: .*pictures"):
        load_config(tmp_path / "eval.yaml")
