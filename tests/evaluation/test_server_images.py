"""Image benchmarks through a server: leap-finetune's own evaluation server (evaluation/serve.py, a real
process on 127.0.0.1) with a tiny LFM2-VL is sent each image as an OpenAI image_url part, decodes it and
generates through the model's processor: the answers equal the ones the model gives in this process, and
they change with the image (the same question about different pictures gets different answers). A text-only
model's server answers an image part with 400; a missing image file is an error before anything is sent."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from leap_finetune.errors import DataError, LeapError
from leap_finetune.evaluation.standalone import evaluate_config
from tests.conftest import EXAMPLES, write_config, write_jsonl

FRUITS = ["banana", "blueberry", "cherry", "lime", "plum", "orange"]
QUESTION = "What color is this fruit?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory) -> Path:
    """tiny-lfm2.5-vl saved with its processor, with larger random weights: greedy answers of varied tokens
    that depend on the picture (the built-in weights answer blank lines whatever the image)."""
    import torch

    from leap_finetune.models.tiny import build_tiny_model, build_tiny_processor, load_tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-vl") / "model"
    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    model = build_tiny_model("tiny-lfm2.5-vl", tokenizer)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(folder)
    build_tiny_processor(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class Served:
    """A running evaluation server and its log (what it was asked since `mark`)."""

    def __init__(self, url: str, log: Path):
        self.url, self.log, self.start = url, log, 0

    def mark(self) -> None:
        self.start = len(self.log.read_text())

    def since(self) -> str:
        return self.log.read_text()[self.start :]


def _serve(model: str, name: str, logs: Path):
    from leap_finetune.runs.processes import ServerSpec, running

    port = _free_port()
    spec = ServerSpec(
        name=name,
        port=port,
        env={"CUDA_VISIBLE_DEVICES": ""},
        command=[sys.executable, "-m", "leap_finetune.evaluation.serve", model, "--port", str(port)]
        + ["--device", "cpu", "--batch-size", "4"],
    )
    return running([spec], logs), Served(f"http://127.0.0.1:{port}/v1", logs / f"{name.replace(' ', '_')}.log")


@pytest.fixture(scope="module")
def vl_server(vl_model, tmp_path_factory):
    context, served = _serve(str(vl_model), "vl server", tmp_path_factory.mktemp("vl-logs"))
    with context:
        yield served


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    context, served = _serve("tiny-lfm2", "text server", tmp_path_factory.mktemp("text-logs"))
    with context:
        yield served


def _image_row(fruit: str, images: str = "images") -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": f"{images}/{fruit}.png"}, {"type": "text", "text": QUESTION}],
            },
            {"role": "assistant", "content": f"A {fruit} is colorful."},
        ]
    }


def _benchmark_folder(folder: Path) -> Path:
    shutil.copytree(EXAMPLES / "data" / "images", folder / "images")
    write_jsonl(folder / "fruits.jsonl", [_image_row(f) for f in FRUITS])
    shutil.copy(EXAMPLES / "data" / "fruit_images_mcq.jsonl", folder / "mcq.jsonl")
    return folder


def _config(folder: Path, model: Path, *, mcq: bool = True, bench: str = "fruits.jsonl") -> Path:
    benchmarks = [{"name": "fruits", "path": bench, "metric": "exact_match"}]
    if mcq:
        benchmarks.append({"name": "fruits_mcq", "path": "mcq.jsonl", "metric": "logprob_mcq", "limit": 4})
    evals = {"max_new_tokens": 8, "batch_size": 4, "benchmarks": benchmarks}
    return write_config(folder, {"model_name": str(model), "chat_template": "model", "evals": evals})


def _predictions(output: Path, name: str) -> list[dict]:
    path = output.with_name(output.stem + ".predictions") / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_image_benchmarks_through_the_server_score_like_local_generation(workdir, vl_model, vl_server):
    config = _config(_benchmark_folder(workdir), vl_model)
    local = evaluate_config(config, output=workdir / "local" / "results.json")
    vl_server.mark()
    remote = evaluate_config(config, output=workdir / "remote" / "results.json", server=vl_server.url)
    assert remote["server"] == vl_server.url and remote["results"]["benchmark/fruits/rows"] == len(FRUITS)
    answers = [p["prediction"] for p in _predictions(workdir / "remote" / "results.json", "fruits")]
    # the server's greedy answers are the model's in this process, which reads the images
    assert answers == [p["prediction"] for p in _predictions(workdir / "local" / "results.json", "fruits")]
    # one question, six pictures: the answers differ, so each request carried its own image
    assert len(set(answers)) > 1, answers
    log = vl_server.since()
    assert log.count("POST /v1/chat/completions") == len(FRUITS)
    served_images = sum(int(line.split(" with ")[1].split()[0]) for line in log.splitlines() if "image(s)" in line)
    assert served_images == len(FRUITS)
    # the log-prob benchmark (images through the processor here, not through the server) as without --server
    for key in ("score", "rows", "accuracy_per_token"):
        assert remote["results"][f"benchmark/fruits_mcq/{key}"] == local["results"][f"benchmark/fruits_mcq/{key}"]
    options = [p["option_logprobs"] for p in _predictions(workdir / "remote" / "results.json", "fruits_mcq")]
    assert options == [p["option_logprobs"] for p in _predictions(workdir / "local" / "results.json", "fruits_mcq")]


def _ask(url: str, content) -> tuple[int, dict]:
    body = {"model": "m", "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": content}]}
    request = urllib.request.Request(
        url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _answer(reply: tuple[int, dict]) -> str:
    status, body = reply
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_the_server_reads_each_image_part_where_it_stands(vl_server):
    from leap_finetune.evaluation.server import image_part

    def parts(*fruits: str) -> list[dict]:
        content = []
        for fruit in fruits:
            content.append(image_part(str(EXAMPLES / "data" / "images" / f"{fruit}.png")))
            content.append({"type": "text", "text": " and "})
        return content + [{"type": "text", "text": QUESTION}]

    banana, blueberry = _answer(_ask(vl_server.url, parts("banana"))), _answer(_ask(vl_server.url, parts("blueberry")))
    assert banana != blueberry  # the picture reached the model
    # the same picture as a path the server reads itself: the same answer as its data URI
    path = {"type": "image_url", "image_url": {"url": str(EXAMPLES / "data" / "images" / "banana.png")}}
    assert _answer(_ask(vl_server.url, [path, {"type": "text", "text": " and " + QUESTION}])) == banana
    # two images: their order is kept (swapped, another answer)
    assert _answer(_ask(vl_server.url, parts("blueberry", "plum"))) != _answer(
        _ask(vl_server.url, parts("plum", "blueberry"))
    )
    # an image that is not one, and a part of an unknown type: 400 with the reason
    status, body = _ask(vl_server.url, [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
    assert status == 400 and "not a readable image" in body["detail"]
    status, body = _ask(vl_server.url, [{"type": "input_audio", "input_audio": {}}])
    assert status == 400 and "'input_audio'" in body["detail"]


@pytest.mark.slow
def test_a_text_only_server_answers_400_for_an_image_part(workdir, vl_model, text_server):
    from leap_finetune.evaluation.server import image_part

    picture = image_part(str(EXAMPLES / "data" / "images" / "lime.png"))
    status, body = _ask(text_server.url, [picture, {"type": "text", "text": QUESTION}])
    assert status == 400
    assert body["detail"] == "'tiny-lfm2' is a text-only model: image parts need a vision-language model (LFM2-VL)"
    # text parts alone are answered
    assert isinstance(_answer(_ask(text_server.url, [{"type": "text", "text": QUESTION}])), str)
    # `eval --server` at a text-only model's server: the row and the server's reason
    config = _config(_benchmark_folder(workdir), vl_model, mcq=False)
    with pytest.raises(LeapError) as info:
        evaluate_config(config, server=text_server.url)
    message = info.value.format()
    assert "failed on benchmark 'fruits'" in message and "is a text-only model" in message, message
    assert "vision-language model" in info.value.fix


@pytest.mark.slow
def test_a_missing_image_file_is_an_error_before_anything_is_sent(workdir, vl_model, vl_server):
    from leap_finetune.evaluation.rows import load_benchmark
    from leap_finetune.evaluation.server import ServerGenerator
    from leap_finetune.validate.loader import load_config

    folder = _benchmark_folder(workdir)
    write_jsonl(folder / "missing.jsonl", [_image_row("banana"), _image_row("durian")])
    vl_server.mark()
    with pytest.raises(DataError) as info:  # found when the rows are read
        evaluate_config(_config(folder, vl_model, mcq=False, bench="missing.jsonl"), server=vl_server.url)
    assert f"image file not found: {folder / 'images' / 'durian.png'}" in info.value.format()
    # a file gone after the rows were read: no row is sent, not even those whose images are there
    resolved = load_config(_config(folder, vl_model, mcq=False))
    items = load_benchmark(resolved.evals.benchmarks[0], vision=True, model_name="vl")
    (folder / "images" / "plum.png").unlink()
    with pytest.raises(LeapError) as info:
        ServerGenerator(vl_server.url).generate("fruits", items, resolved.evals)
    message = info.value.format()
    assert f"the image file {folder / 'images' / 'plum.png'} cannot be read" in message
    assert "nothing was sent to the server" in message and info.value.where == f"{items[4].file}, {items[4].location}"
    assert "POST /v1/chat/completions" not in vl_server.since()


def test_image_parts_keep_their_place_and_mime_type(tmp_path):
    from PIL import Image

    from leap_finetune.evaluation.server import chat_messages, image_part

    Image.new("RGB", (8, 8), (200, 10, 10)).save(tmp_path / "red.jpg")
    noise = Image.effect_noise((32, 32), 64).convert("RGB")
    noise.save(tmp_path / "blue", format="PNG")  # no suffix: the type is read from the bytes
    url = "https://example.com/cat.webp"
    item = SimpleNamespace(
        file="bench.jsonl",
        location="row 1",
        prompt=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "<image>Compare with <image>"},
            {"role": "assistant", "content": "Red and blue."},
            {"role": "user", "content": f"And {url}?<image>"},
        ],
        images=[str(tmp_path / "red.jpg"), str(tmp_path / "blue"), url],
    )
    messages = chat_messages(item)
    assert messages[0] == item.prompt[0] and messages[2] == item.prompt[2]  # no image: as they were
    first, last = messages[1]["content"], messages[3]["content"]
    assert [p["type"] for p in first] == ["image_url", "text", "image_url"] and first[1]["text"] == "Compare with "
    assert first[0]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert first[2]["image_url"]["url"].startswith("data:image/png;base64,")
    assert last == [{"type": "text", "text": f"And {url}?"}, {"type": "image_url", "image_url": {"url": url}}]
    data = first[0]["image_url"]["url"].split(",", 1)[1]
    assert base64.b64decode(data) == (tmp_path / "red.jpg").read_bytes()
    # an image a row holds inline (a data URI without its subtype, or bare base64 text): sent with its MIME type
    png = (tmp_path / "blue").read_bytes()
    for inline in ("data:image;base64," + base64.b64encode(png).decode(), base64.b64encode(png).decode()):
        assert image_part(inline)["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(png).decode()
    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(LeapError, match="notes.txt is not an image"):
        image_part(str(tmp_path / "notes.txt"))
    # text-only rows are sent as they are
    plain = SimpleNamespace(prompt=[{"role": "user", "content": "Hi <image>"}], images=[])
    assert chat_messages(plain) == plain.prompt


def test_the_server_takes_its_processor_from_the_folder_else_from_processor(tmp_path, vl_model):
    """What `python -m leap_finetune.evaluation.serve` decides at start: a folder with processor files reads
    them; a training checkpoint (none) refuses image parts with what to do, or reads the base model's given
    with --processor; a text-only model refuses them."""
    from leap_finetune.evaluation.serve import image_processor
    from leap_finetune.models.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    processor, why = image_processor(str(vl_model), None, tokenizer)
    assert why is None and processor.image_processor.max_image_tokens == 16
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(vl_model / name, checkpoint / name)
    processor, why = image_processor(str(checkpoint), None, tokenizer)
    assert processor is None and "holds no image processor files" in why and "--processor BASE_MODEL" in why
    processor, why = image_processor(str(checkpoint), "tiny-lfm2.5-vl", tokenizer)
    assert why is None and processor.tokenizer is tokenizer
    processor, why = image_processor("tiny-lfm2", None, load_tiny_tokenizer("tiny-lfm2"))
    assert processor is None and "text-only" in why
