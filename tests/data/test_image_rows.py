"""Rows with images for a vision-language run (tiny-lfm2.5-vl, its real LFM2-VL processor): every image read and
counted before any model loads, each broken file a clear error naming the row, the masks token by token, and the
image tokens computed from sizes equal to what the processor itself makes."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from leap_finetune.data.images import ImageReader
from leap_finetune.data.render import IGNORE_INDEX
from leap_finetune.launch.checks import prepare
from leap_finetune.models.tiny import TINY_IMAGE_PROCESSOR, load_tiny_tokenizer
from leap_finetune.models.vision import load_processor
from leap_finetune.validate.loader import load_config
from tests.conftest import invoke, write_config, write_jsonl

QUESTION = {"type": "text", "text": "What colour is it?"}


def picture(path, size=(48, 48), colour=(200, 30, 30)):
    Image.new("RGB", size, colour).save(path)
    return path


def image_row(*images, answer="red", system=None):
    parts = [{"type": "image", "image": image} for image in images] + [QUESTION]
    messages = [{"role": "system", "content": system}] if system is not None else []
    return {"messages": messages + [{"role": "user", "content": parts}, {"role": "assistant", "content": answer}]}


def vl_config(**training):
    return {
        "model_name": "tiny-lfm2.5-vl",
        "training_type": "sft",
        "dataset": {"path": "train.jsonl"},
        "training_config": {"max_length": 128, "max_steps": 2, **training},
    }


@pytest.fixture(scope="module")
def reader():
    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    return ImageReader(load_processor("tiny-lfm2.5-vl", tokenizer))


def test_rows_with_images_are_expanded_and_only_the_answer_carries_loss(workdir, reader):
    picture(workdir / "a.png", (48, 48))
    picture(workdir / "b.png", (200, 90), (20, 200, 20))
    write_jsonl(workdir / "train.jsonl", [image_row("a.png", "b.png", answer="red and green")] * 4)
    resolved = load_config(write_config(workdir, vl_config()))
    tokenizer, _, prepared = prepare(resolved, examples=1)
    row = prepared.train.table.slice(0, 1).to_pylist()[0]
    ids, labels = np.asarray(row["input_ids"]), np.asarray(row["labels"])
    # each image's tokens, as the processor makes them for that image (the text with the two images expanded)
    processor = reader.processor
    text = prepared.train.examples[0]["text"]
    expected = processor(
        text=[text], images=[[Image.open(workdir / "a.png"), Image.open(workdir / "b.png")]], return_tensors="np"
    )["input_ids"][0]
    assert ids.tolist() == expected.tolist()
    assert row["image_sources"] == [str(workdir / "a.png"), str(workdir / "b.png")]
    assert row["image_tiles"] == 2  # (one picture each, not split: the tiny processor's settings)
    from leap_finetune.data.token_batches import TILE_TOKENS
    from leap_finetune.recipes.sampling import row_lengths

    # the batch balance counts each tile's vision-encoder work on top of the tokens
    assert row_lengths(prepared.train.dataset())[0] == len(ids) + 2 * TILE_TOKENS
    assert sum(row["image_tokens"]) == int(np.isin(ids, image_token_ids(tokenizer)).sum())
    # token by token: loss exactly on the answer and its end-of-turn token; never on an image token or the prompt
    trained = labels != IGNORE_INDEX
    assert tokenizer.decode(ids[trained]) == "red and green<|im_end|>"
    assert not trained[np.isin(ids, image_token_ids(tokenizer))].any()
    assert (labels[trained] == ids[trained]).all()
    first_answer = int(np.flatnonzero(trained)[0])
    assert not trained[:first_answer].any() and tokenizer.decode(ids[:first_answer]).endswith("assistant\n")
    # inspect: the rendered text keeps one <image> per image, with each image's size, tiles and tokens
    example = prepared.train.examples[0]
    assert example["text"].count("<image>") == 2
    assert [(i["size"], i["tokens"]) for i in example["images"]] == [
        ("48x48", row["image_tokens"][0]),
        ("200x90", row["image_tokens"][1]),
    ]
    assert example["tokens"] == len(ids)


def image_token_ids(tokenizer) -> list[int]:
    from leap_finetune.models.tiny import IMAGE_TOKENS

    return tokenizer.convert_tokens_to_ids(IMAGE_TOKENS)


@pytest.mark.parametrize("size", [(16, 16), (48, 48), (64, 200), (300, 40), (1024, 768), (2000, 500)])
@pytest.mark.parametrize("splitting", [False, True])
def test_image_tokens_from_the_size_equal_the_processors_own(reader, size, splitting):
    """The size-only computation (no pixels resized while rows are prepared) against the processor's output, for
    images it scales up, scales down, and (with splitting) cuts into tiles plus a thumbnail."""
    settings = {"do_image_splitting": splitting, "tile_size": 64, "max_tiles": 6, "min_tiles": 2}
    sized = ImageReader(load_processor("tiny-lfm2.5-vl", reader.tokenizer), settings)
    image = Image.new("RGB", size, (10, 20, 30))
    made = sized.processor(text=["<image>"], images=[[image]], return_tensors="np")["input_ids"][0].tolist()
    layout = sized.layout(*size)
    assert list(layout.ids) == made
    pixels = sized.pixels_of([image])
    assert pixels["pixel_values"].shape[0] == layout.tiles  # one encoder picture per tile (+ thumbnail)
    # the largest picture's real patches (what the encoder is cut to: models/vision.py), as the processor masks them
    assert layout.patches == int(pixels["pixel_attention_mask"].sum(-1).max())


def data_uri(colour=(1, 2, 3), fmt="PNG") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 40), colour).save(buffer, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def test_images_by_data_uri_base64_absolute_path_image_root_and_an_images_column(workdir):
    pictures = workdir / "pictures"
    pictures.mkdir()
    picture(pictures / "p.png")
    raw = data_uri().partition(",")[2]
    rows = [
        image_row(data_uri()),
        image_row(raw),
        image_row(str(pictures / "p.png")),
        image_row("p.png"),  # relative to dataset.image_root
        {  # the Hugging Face / TRL layout: {"type": "image"} parts take the row's images column, in order
            "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "image"}, QUESTION]},
                {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
            ],
            # as a Hub dataset's Image column stores them: {bytes, path} structs (decoded bytes, or a path)
            "images": [{"bytes": base64.b64decode(raw), "path": None}, {"bytes": None, "path": "p.png"}],
        },
    ]
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(workdir / "train.jsonl", rows[:4])
    pq.write_table(pa.Table.from_pylist(rows[4:]), workdir / "hub.parquet")
    config = vl_config()
    config["dataset"] = [
        {"path": "train.jsonl", "image_root": "pictures"},
        {"path": "hub.parquet", "image_root": "pictures"},
    ]
    resolved = load_config(write_config(workdir, config))
    _, _, prepared = prepare(resolved)
    sources = prepared.train.column("image_sources")
    assert len(sources) == 5 and all(len(s) >= 1 for s in sources)
    assert str(pictures / "p.png") in sources[2] + sources[3]
    assert prepared.train.images()[1] == 6


BROKEN = [
    ("missing", lambda d: image_row("gone.png"), "messages[0].content[0]", "image file not found"),
    (
        "truncated",
        lambda d: image_row(truncated_png(d)),
        "messages[0].content[0]",
        "cannot be decoded",
    ),
    (
        "not an image",
        lambda d: image_row(not_an_image(d)),
        "messages[0].content[0]",
        "is not an image Pillow can read",
    ),
    (
        "too many image tokens",
        lambda d: image_row(str(picture(d / "big.png", (640, 640)))),
        "messages",
        "> max_length 24",
    ),
    (
        "image in the system prompt",
        lambda d: image_row(str(picture(d / "s.png")), system=[{"type": "image", "image": "s.png"}]),
        "messages[0].content",
        "the system prompt cannot hold an image",
    ),
    (
        "system prompt of a wrong shape",
        lambda d: image_row(str(picture(d / "s.png")), system={"text": "be brief"}),
        "messages[0].content",
        "expected a string or a list of typed parts, got an object",
    ),
    (
        "image in the answer",
        lambda d: {
            "messages": [
                {"role": "user", "content": "Draw"},
                {"role": "assistant", "content": [{"type": "image", "image": str(picture(d / "x.png"))}]},
            ]
        },
        "messages[1].content",
        "an assistant turn cannot hold an image",
    ),
    (
        "image given by URL",
        lambda d: image_row("https://example.com/cat.png"),
        "messages[0].content[0]",
        "images must be local",
    ),
    (
        "the image token in an answer",
        lambda d: image_row(str(picture(d / "t.png")), answer="see <image>"),
        "messages[1].content",
        "the model's image token",
    ),
    (
        "a long string that is neither a file nor base64 of an image",
        lambda d: image_row("Zm9v" * 80),
        "messages[0].content[0]",
        "nor base64 of a PNG, JPEG",
    ),
    (
        "an image over Pillow's decompression-bomb limit",
        lambda d: image_row(bomb_png(d)),
        "messages[0].content[0]",
        "is larger than Pillow opens",
    ),
    (
        "an image between Pillow's warning and its refusal (12,000 x 12,000 pixels)",
        lambda d: image_row(bomb_png(d, 12000)),
        "messages[0].content[0]",
        "is over Pillow's safe size (89,478,485 pixels)",
    ),
    (
        "an image path that is a folder",
        lambda d: image_row(a_folder(d)),
        "messages[0].content[0]",
        "is a folder, not an image file",
    ),
    (
        "the image token written as text",
        lambda d: {
            "messages": [
                {"role": "user", "content": "<image> what is it?"},
                {"role": "assistant", "content": "red"},
            ]
        },
        "messages[0].content",
        "the model's image token",
    ),
]


def bomb_png(folder, side: int = 30000):
    """A PNG whose header says side x side pixels (30,000: over twice Pillow's MAX_IMAGE_PIXELS, its
    DecompressionBombError; 12,000: between the two, where Pillow only warns), made from a 1 x 1 picture: the
    header's size rewritten and its checksum made anew."""
    import struct
    import zlib

    data = bytearray(picture(folder / "one.png", (1, 1)).read_bytes())
    start = data.index(b"IHDR")
    data[start + 4 : start + 12] = struct.pack(">II", side, side)
    data[start + 17 : start + 21] = struct.pack(">I", zlib.crc32(bytes(data[start : start + 17])))
    (folder / "bomb.png").write_bytes(bytes(data))
    return "bomb.png"


def a_folder(folder):
    (folder / "pictures").mkdir()
    return "pictures"


def truncated_png(folder):
    full = picture(folder / "full.png", (64, 64), (1, 2, 3))
    data = full.read_bytes()
    (folder / "cut.png").write_bytes(data[: len(data) // 2])
    return "cut.png"


def not_an_image(folder):
    (folder / "notes.png").write_text("these are my notes, not a picture")
    return "notes.png"


@pytest.mark.parametrize("name,make,field,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_image_row_is_a_clear_error_naming_the_row(workdir, name, make, field, words):
    picture(workdir / "ok.png")
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png"), image_row("ok.png"), make(workdir)])
    config = write_config(workdir, vl_config(max_length=24 if "tokens" in name else 128))
    result = invoke("validate", str(config), cwd=workdir)
    assert result.returncode == 2, result.stdout + result.stderr
    message = " ".join(result.stderr.split())
    assert "line 3" in message and f"field '{field}'" in message and words in message, message
    assert "Traceback" not in result.stderr
    assert not (workdir / "outputs").exists()  # nothing written


def test_on_invalid_skip_drops_each_kind_of_broken_image_row_and_says_so(workdir):
    picture(workdir / "ok.png")
    rows = [image_row("ok.png")] * 3 + [
        image_row("gone.png"),
        image_row(truncated_png(workdir)),
        image_row(not_an_image(workdir)),
        image_row(str(picture(workdir / "big.png", (640, 640)))),  # 18 image tokens: 42 > max_length 36
        image_row(bomb_png(workdir)),  # (was a traceback even with on_invalid: skip)
    ]
    write_jsonl(workdir / "train.jsonl", rows)
    config = vl_config(max_length=36)
    config["dataset"]["on_invalid"] = "skip"
    resolved = load_config(write_config(workdir, config))
    _, _, prepared = prepare(resolved)
    assert len(prepared.train) == 3 and prepared.invalid_skipped == 5
    reasons = " | ".join(d.reason for d in prepared.dropped)
    for words in ("image file not found", "cannot be decoded", "is not an image", "> max_length 36", "larger than"):
        assert words in reasons, reasons


@pytest.mark.parametrize(
    "config_change,words",
    [
        ({"model_name": "tiny-lfm2"}, "applies to vision-language models, and 'tiny-lfm2' is a text model"),
        ({"training_type": "kto"}, "applies to image training (sft, dpo or grpo with a vision-language model)"),
    ],
)
def test_vision_keys_on_a_text_model_or_type_say_where_they_belong(workdir, config_change, words):
    config = {**vl_config(train_vision_encoder=False), **config_change}
    write_jsonl(workdir / "train.jsonl", [{"messages": [{"role": "user", "content": "a"}]}])
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    assert result.returncode == 2 and words in " ".join(result.stderr.split()), result.stderr


@pytest.mark.parametrize(
    "training,peft,words",
    [
        ({"train_projector": "yes"}, None, "training_config.train_projector is 'yes'"),
        ({"vision_encoder_lr_multiplier": 0}, None, "vision_encoder_lr_multiplier is 0"),
        (
            {"train_vision_encoder": False, "train_projector": False, "train_language_model": False},
            None,
            "nothing would train",
        ),
        (
            {"train_language_model": False, "train_projector": True},
            {"extends": "DEFAULT_VLM_LORA"},
            "leaves the adapters nothing to train",
        ),
        ({"extends": "DEFAULT_VLM_SFT", "model_name": None}, None, "is a text model"),
        ({"packing": True}, None, "rows with images are not packed"),
    ],
)
def test_bad_vision_values_are_refused_before_anything_loads(workdir, training, peft, words):
    training = dict(training)
    config = vl_config(**{k: v for k, v in training.items() if k != "model_name"})
    if "model_name" in training:
        config["model_name"] = "tiny-lfm2"
    if peft:
        config["peft_config"] = peft
    picture(workdir / "ok.png")
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png")])
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    assert result.returncode == 2 and words in " ".join(result.stderr.split()), result.stderr


def test_lora_targets_of_a_vision_model_stay_on_the_language_model(workdir):
    picture(workdir / "ok.png")
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png")])
    config = vl_config()
    config["peft_config"] = {"extends": "DEFAULT_LORA"}  # a plain list of names (SigLIP2 has q/k/v/out_proj too)
    resolved = load_config(write_config(workdir, config))
    import re

    targets = resolved.peft["target_modules"]
    assert re.fullmatch(targets, "model.language_model.layers.1.self_attn.q_proj")
    assert not re.fullmatch(targets, "model.vision_tower.encoder.layers.0.self_attn.q_proj")
    trains = {k: resolved.training[k] for k in ("train_vision_encoder", "train_projector", "train_language_model")}
    assert trains == {"train_vision_encoder": False, "train_projector": False, "train_language_model": True}


def test_image_processor_settings_change_the_tokens_and_are_checked(workdir):
    picture(workdir / "ok.png", (256, 256))
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png")])
    counts = {}
    for tokens in (4, 16):
        config = {**vl_config(), "image_processor": {"max_image_tokens": tokens}}
        _, _, prepared = prepare(load_config(write_config(workdir, config)))
        counts[tokens] = prepared.train.images()[2]
    assert counts[4] < counts[16]
    bad = {**vl_config(), "image_processor": {"max_image_token": 8}}
    result = invoke("validate", str(write_config(workdir, bad)), cwd=workdir)
    assert result.returncode == 2 and "max_image_tokens" in result.stderr
    text_model = {**vl_config(), "model_name": "tiny-lfm2", "image_processor": {"max_image_tokens": 8}}
    result = invoke("validate", str(write_config(workdir, text_model)), cwd=workdir)
    assert result.returncode == 2 and "image_processor applies to vision-language models" in result.stderr


def test_tiny_processor_settings_are_what_the_tests_assume():
    assert TINY_IMAGE_PROCESSOR["max_image_tokens"] == 16 and not TINY_IMAGE_PROCESSOR["do_image_splitting"]


def test_a_decoded_picture_of_a_hub_images_column_becomes_a_data_uri_that_reads_back(tmp_path):
    """What a Hub dataset's Image column yields (PIL pictures) is kept as a data URI string in the prepared rows."""
    from leap_finetune.data.images import open_image
    from leap_finetune.data.messages import ImageParts, parse_content

    picture = Image.new("RGB", (30, 20), (9, 99, 199))
    parts = ImageParts(tmp_path, [picture])
    problems = []
    content = parse_content([{"type": "image"}, QUESTION], "m[0].content", lambda *p: problems.append(p), images=parts)
    assert problems == [] and content.text == "<image>What colour is it?"
    [ref] = content.images
    assert ref.source.startswith("data:image/png;base64,") and ref.field == "images[0]"
    back = open_image(ref.source)
    assert back.size == (30, 20) and back.getpixel((3, 3)) == (9, 99, 199)


def test_the_cache_is_used_only_while_the_pictures_are_unchanged(workdir, monkeypatch):
    """The cache key holds the data files, not the pictures: a changed picture, or a fixed one that was missing,
    prepares the rows again; unchanged ones read them from the cache (samples keep their pictures)."""
    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(workdir / "cache"))
    picture(workdir / "a.png", (48, 48))
    write_jsonl(workdir / "train.jsonl", [image_row("a.png")] * 3 + [image_row("later.png")])
    config = vl_config()
    config["dataset"]["on_invalid"] = "skip"
    config["dataset"]["test_size"] = 1
    config["samples"] = 1
    path = write_config(workdir, config)
    first = prepare(load_config(path))[2]
    assert first.from_cache is None and len(first.train) + len(first.eval) == 3
    again = prepare(load_config(path))[2]
    assert again.from_cache is None  # a row was dropped for its picture: it may be there now
    picture(workdir / "later.png", (48, 48))
    fixed = prepare(load_config(path))[2]
    assert fixed.from_cache is None and len(fixed.train) + len(fixed.eval) == 4
    cached = prepare(load_config(path))[2]
    assert cached.from_cache is not None
    assert cached.sample_messages[0].images and cached.sample_messages[0].images[0].source.endswith(".png")
    picture(workdir / "a.png", (640, 200))  # same name, another picture: other tokens
    changed = prepare(load_config(path))[2]
    assert changed.from_cache is None
    assert changed.train.images()[2] + changed.eval.images()[2] != cached.train.images()[2] + cached.eval.images()[2]


def test_image_grpo_prompts_are_prepared_again_when_a_picture_changes(workdir, monkeypatch):
    """GRPO keeps its prompts' pictures in another column than SFT's: the cache did not see them, so a picture
    replaced by a truncated one (or deleted) was read from the cache as valid, and trained on."""
    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(workdir / "cache"))
    picture(workdir / "a.png", (48, 48))
    prompt = [{"role": "user", "content": [{"type": "image", "image": "a.png"}, QUESTION]}]
    write_jsonl(workdir / "train.jsonl", [{"prompt": prompt, "solution": "red"}] * 4)
    config = {
        "model_name": "tiny-lfm2.5-vl",
        "training_type": "grpo",
        "dataset": {"path": "train.jsonl"},
        "rewards": ["accuracy"],
        "training_config": {"use_vllm": False, "max_steps": 1, "max_completion_length": 8},
    }
    path = write_config(workdir, config)
    first = prepare(load_config(path))[2]
    assert first.from_cache is None
    assert prepare(load_config(path))[2].from_cache is not None  # (unchanged: read from the cache)
    (workdir / "a.png").write_bytes((workdir / "a.png").read_bytes()[:40])  # truncated
    result = invoke("validate", str(path), cwd=workdir)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "a.png" in said and "Traceback" not in said, said


def test_url_safe_base64_reads_and_a_range_the_config_half_sets_is_checked(workdir):
    raw = data_uri().partition(",")[2]
    urlsafe = raw.replace("+", "-").replace("/", "_").rstrip("=")
    write_jsonl(workdir / "train.jsonl", [image_row(urlsafe), image_row(raw)])
    _, _, prepared = prepare(load_config(write_config(workdir, vl_config())))
    assert prepared.train.images()[1] == 2
    # min_tiles alone above the model's max_tiles: said before anything trains, naming both keys
    config = {**vl_config(), "image_processor": {"min_tiles": 12, "do_image_splitting": True}}
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    assert result.returncode == 2, result.stderr
    assert "min_tiles 12 is larger than max_tiles" in " ".join(result.stderr.split())


def test_init_for_a_vision_model_writes_an_image_starter_that_validates(workdir):
    result = invoke("init", "vl.yaml", "--model", "tiny-lfm2.5-vl", cwd=workdir)
    assert result.returncode == 0, result.stderr
    text = (workdir / "vl.yaml").read_text()
    assert "extends: DEFAULT_VLM_SFT" in text and "DEFAULT_VLM_LORA" in text and "packing" not in text
    example = next(line for line in text.splitlines() if '{"messages"' in line).strip().lstrip("# ")
    (workdir / "data" / "images").mkdir(parents=True)
    picture(workdir / "data" / "images" / "0001.png")
    (workdir / "data" / "train.jsonl").write_text((example + "\n") * 30)
    result = invoke("validate", "vl.yaml", cwd=workdir)
    assert result.returncode == 0, result.stderr


def test_a_benchmark_picture_that_does_not_decode_is_refused_by_validate(workdir):
    picture(workdir / "ok.png")
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png")] * 2)
    write_jsonl(workdir / "bench.jsonl", [image_row("ok.png"), image_row(truncated_png(workdir))])
    config = {**vl_config(), "evals": {"benchmarks": [{"name": "b", "path": "bench.jsonl", "metric": "exact_match"}]}}
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    assert result.returncode == 2, result.stderr
    message = " ".join(result.stderr.split())
    assert "bench.jsonl, line 2" in message and "cannot be decoded" in message, message
