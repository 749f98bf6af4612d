"""leap-finetune's evaluation server (evaluation/serve.py) loading another folder's weights while it runs
(`POST /v1/load_weights`, what `async_eval.reserved.weight_reload: in_place` sends each snapshot): a real server
process on 127.0.0.1, real tiny models. After a reload the server answers as the new model does (greedy answers
equal to in-process generation with that model); a folder of another architecture, a missing folder or a bad body is
refused with what is wrong and the served weights stay; requests in flight during a reload are all answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from tests.watchdog import Watchdog, wait_until

PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello."]


def _folder(path: Path, seed: int, **arch) -> Path:
    """A tiny LFM2 with its own random weights (`seed`) and, optionally, another architecture."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from leap_finetune.models.lfm2_keys import add_original_lfm2_keys
    from leap_finetune.models.tiny import TINY_ARCH, load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    config = Lfm2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **{**TINY_ARCH, **arch},
    )
    torch.manual_seed(seed)
    model = Lfm2ForCausalLM(config)
    with torch.no_grad():  # (peaked logits over tokens that print: a random model's greedy answer is text, not "")
        embeddings = model.get_input_embeddings().weight
        embeddings.mul_(20)
        blank = [i for i in range(len(tokenizer)) if not tokenizer.decode([i], skip_special_tokens=True).strip()]
        embeddings[blank] = 0
    add_original_lfm2_keys(model.config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _expected(folder: Path, tokens: int = 12) -> list[str]:
    """What generation in this process answers with the folder's model (greedy, as the server's requests ask)."""
    from leap_finetune.evaluation.generation import generate
    from leap_finetune.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(folder), {})
    model = load_model(str(folder), tokenizer, {}, dtype=torch.float32).eval()
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS
    ]
    return generate(model, tokenizer, prompts, max_new_tokens=tokens, batch_size=1, do_sample=False)


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _ask(url: str, prompt: str, tokens: int = 12) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0}
    status, answer = _post(f"{url}/v1/chat/completions", body)
    assert status == 200, answer
    return answer["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def running_server(tmp_path_factory):
    """One server process for the module (its start-up is most of a test's time), serving `first`."""
    import socket

    folder = tmp_path_factory.mktemp("served")
    first = _folder(folder / "first", seed=1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leap_finetune.evaluation.serve",
            str(first),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--batch-size",
            "1",
        ],  # fmt: skip
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy():
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, Watchdog(process.pid, what="the evaluation server"), poll_s=0.2)
        yield url, first, folder / "server.log"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


class Served(NamedTuple):
    url: str
    first: Path  # the weights served when the test starts
    folder: Path  # the test's own folder
    log: Callable[[], str]  # what the server wrote during the test


@pytest.fixture
def server(running_server, tmp_path) -> Served:
    """The module's server, serving `first`'s weights again (a test before may have loaded others)."""
    url, first, log = running_server
    status, answer = _post(f"{url}/v1/load_weights", {"model": str(first)})
    assert status == 200, answer
    offset = log.stat().st_size
    return Served(url, first, tmp_path, lambda: log.read_bytes()[offset:].decode(errors="replace"))


def test_the_server_answers_as_the_reloaded_model_and_refuses_other_models(server):
    url, first, folder, log = server
    second = _folder(folder / "second", seed=2)
    before = [_ask(url, p) for p in PROMPTS]
    assert before == _expected(first)
    with urllib.request.urlopen(f"{url}/health") as health:
        reloads = json.loads(health.read())["reloads"]
    status, answer = _post(f"{url}/v1/load_weights", {"model": str(second)})
    assert status == 200 and answer["model"] == str(second) and answer["tensors"] > 0, answer
    after = [_ask(url, p) for p in PROMPTS]
    assert after == _expected(second) and after != before
    with urllib.request.urlopen(f"{url}/health") as health:
        assert json.loads(health.read()) == {"status": "ok", "weights": str(second), "reloads": reloads + 1}
    with urllib.request.urlopen(f"{url}/v1/models") as models:
        assert json.loads(models.read())["data"][0]["id"] == str(second)

    # refused, the served weights kept: another architecture, a missing folder, a body without a folder
    wider = _folder(folder / "wider", seed=3, hidden_size=64, intermediate_size=192)
    status, answer = _post(f"{url}/v1/load_weights", {"model": str(wider)})
    assert status == 400 and "is not a model of the served architecture (other shapes for" in answer["detail"]
    assert "nothing was loaded" in answer["detail"]
    status, answer = _post(f"{url}/v1/load_weights", {"model": str(folder / "nowhere")})
    assert status == 400 and "nowhere' is not a folder on the server's machine" in answer["detail"]
    status, answer = _post(f"{url}/v1/load_weights", {"folder": str(second)})
    assert status == 400 and answer["detail"] == 'expected {"model": "<a model folder>"}'
    request = urllib.request.Request(f"{url}/v1/load_weights", data=b"garbage", headers={"Content-Type": "text/plain"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400 and json.loads(refused.value.read())["detail"].startswith("expected {")
    # an embedding / ColBERT run's model (sentence-transformers' folder: modules.json) or another model class
    import shutil

    encoder = Path(shutil.copytree(second, folder / "encoder"))
    (encoder / "modules.json").write_text("[]")
    status, answer = _post(f"{url}/v1/load_weights", {"model": str(encoder)})
    assert (
        status == 400 and "is a sentence-transformers (embedding / ColBERT) model, not a chat model" in answer["detail"]
    )
    other = Path(shutil.copytree(second, folder / "other"))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["Lfm2Model"]}))
    status, answer = _post(f"{url}/v1/load_weights", {"model": str(other)})
    assert status == 400 and "holds a Lfm2Model, the server runs a Lfm2ForCausalLM" in answer["detail"]
    assert [_ask(url, p) for p in PROMPTS] == after


def test_requests_in_flight_during_a_reload_are_all_answered(server):
    """A reload sent while requests queue (one batch of one generating, the others waiting) waits for the batch being
    generated, and the batches after it use the new weights: every answer is one of the two models' own answers
    (never a mix, never an error), requests asked before the reload finished are answered by the new weights too
    (they waited in the queue), and the server's log shows batches before and after the reload."""
    url, first, folder, log = server
    second = _folder(folder / "second", seed=2)
    old, new = _expected(first, 64), _expected(second, 64)
    reloaded = threading.Event()

    def keep_asking(index: int) -> list[tuple[int, str, bool]]:
        """Asks until the reload has answered and once more: (prompt, answer, asked before the reload answered)."""
        answers = []
        while True:
            before = not reloaded.is_set()
            answers.append((index, _ask(url, PROMPTS[index], 64), before))
            if not before:
                return answers

    with ThreadPoolExecutor(9) as pool:
        askers = [pool.submit(keep_asking, i % len(PROMPTS)) for i in range(8)]
        wait_until(
            lambda: "generated 1 answer" in log(),
            Watchdog(os.getpid(), what="the evaluation server"),
        )
        status, _ = _post(f"{url}/v1/load_weights", {"model": str(second)})
        reloaded.set()
        answers = [answer for asker in askers for answer in asker.result()]
    assert status == 200
    assert all(answer in (old[index], new[index]) for index, answer, _ in answers)
    assert any(before and answer == old[index] for index, answer, before in answers)
    # queued while the reload waited for the lock, answered after it by the new weights
    assert any(before and answer == new[index] for index, answer, before in answers)
    lines = log().splitlines()
    loaded = next(i for i, line in enumerate(lines) if "loaded the weights of" in line)
    assert any("generated 1 answer" in line for line in lines[:loaded])
    assert any("generated 1 answer" in line for line in lines[loaded:])


def test_the_reserved_driver_reloads_through_vllms_two_requests(server):
    """What `weight_reload: in_place` sends to any evaluation server (evaluation/reserved.py, vLLM's developer API:
    POST /collective_rpc reload_weights, then /reset_prefix_cache), against this server: the second model's answers
    after it, and a refusal comes back in the server's own words with the served weights kept. (vLLM's side of the
    same two requests is run on the GPU machine: bench/async_eval_vllm.py --modes in_place.)"""
    from leap_finetune.evaluation.reserved import _post_reload

    url, first, folder, log = server
    second = _folder(folder / "second", seed=2)
    answer: dict = {}
    _post_reload(url, second, 60, answer)
    assert answer == {}
    after = [_ask(url, p) for p in PROMPTS]
    assert after == _expected(second) and after != _expected(first)
    wider = _folder(folder / "wider", seed=3, hidden_size=64, intermediate_size=192)
    _post_reload(url, wider, 60, answer)
    assert answer["error"].startswith(f"the evaluation server refused the weights of {wider} (400: ")
    assert "is not a model of the served architecture" in answer["error"]
    assert [_ask(url, p) for p in PROMPTS] == after
    status, said = _post(f"{url}/collective_rpc", {"method": "sleep"})
    assert status == 400 and "this server runs one method" in said["detail"]


def test_a_server_without_the_reload_endpoint_and_vllm_error_bodies_are_said_plainly(server):
    """A server that has no /collective_rpc (vLLM without VLLM_SERVER_DEV_MODE, or a version without it) answers 404:
    the message says what is missing and what to use instead. vLLM's and FastAPI's error bodies become their text."""
    from leap_finetune.evaluation.reserved import _post_reload, _said

    url, first, folder, log = server
    answer: dict = {}
    _post_reload(f"{url}/elsewhere", first, 60, answer)
    assert "has no POST /collective_rpc" in answer["error"] and "VLLM_SERVER_DEV_MODE=1" in answer["error"]
    assert "weight_reload: respawn" in answer["error"]
    assert _said({"error": {"message": "bad weights", "type": "BadRequestError", "code": 400}}) == "bad weights"
    assert _said({"detail": [{"loc": ["body"], "msg": "field required"}, {"msg": "x"}]}) == "field required; x"
    assert _said({"message": "plain"}) == "plain" and _said({}) is None
