"""Reasoning ("thinking") rows: an assistant's `thinking` / `reasoning_content` field, or a `<think>` block in its
content, rendered exactly as LFM2.5's official chat template renders it (TRL's byte-identical copy of LiquidAI's
file: the history turns' reasoning dropped, the last turns' kept), trained or not by `loss_on_thinking`, shown by
`inspect`; a template that would drop the field is refused; a `<think>` block in a benchmark answer is taken out
before scoring and counted."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from leap_finetune.errors import LeapError
from tests.conftest import write_config, write_jsonl

ROW = {
    "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "thinking": "Two plus two.", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "reasoning_content": "Three plus three is six.", "content": "6"},
    ]
}
INLINE = {  # the reasoning written into content: the same rendering
    "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>Two plus two.</think>4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>Three plus three is six.</think>6"},
    ]
}
# LFM2.5's official template: the first answer's reasoning is gone (it comes before the last user message), the
# last one's is rendered as <think>...</think> right before its answer
RENDERED = (
    "<|startoftext|><|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n<think>Three plus three is six.</think>6<|im_end|>\n"
)


def _inspect(workdir, rows, **training):
    from leap_finetune.api import inspect_config

    write_jsonl(workdir / "train.jsonl", rows)
    config = {"model_name": "tiny-lfm2.5", "chat_template": "lfm2.5", "dataset": {"path": "train.jsonl"},
              "training_config": {"max_steps": 1, **training}}  # fmt: skip
    return inspect_config(write_config(workdir, config), rows=len(rows))


def _trained(item) -> str:
    return "".join(item["text"][start:end] for start, end in item["trained_spans"])


def test_reasoning_renders_as_the_official_template_and_trains_by_loss_on_thinking(workdir):
    from leap_finetune.data.chat_templates import official_template

    assert "reasoning_content" in official_template("lfm2.5")  # (the template file read is the official one)
    trained, inline = _inspect(workdir, [ROW, INLINE])
    assert trained["text"] == RENDERED and inline["text"] == RENDERED
    assert _trained(trained) == "4<|im_end|><think>Three plus three is six.</think>6<|im_end|>"  # default: trained
    masked, masked_inline = _inspect(workdir, [ROW, INLINE], loss_on_thinking=False)
    assert masked["text"] == RENDERED  # inspect shows it, not highlighted
    assert _trained(masked) == _trained(masked_inline) == "4<|im_end|>6<|im_end|>"


def test_a_template_that_drops_the_reasoning_field_is_refused_row_by_row(workdir):
    from leap_finetune.api import validate_config

    write_jsonl(workdir / "train.jsonl", [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant",
                                                        "content": "a"}]}, ROW])  # fmt: skip
    config = {"model_name": "tiny-lfm2", "chat_template": "lfm2", "dataset": {"path": "train.jsonl"}}
    with pytest.raises(LeapError) as err:
        validate_config(write_config(workdir, config))
    text = " ".join(err.value.format().split())
    assert "line 2" in text and "messages[1].thinking" in text
    assert "the chat template 'lfm2' does not render an assistant's thinking" in text and "lfm2.5" in text


def test_split_thinking_takes_the_reasoning_out_of_an_answer():
    from leap_finetune.data.render import split_thinking, without_thinking

    assert split_thinking("<think>Paris is the capital.</think>\nParis") == ("Paris", "Paris is the capital.")
    assert split_thinking("<think>still going") == ("", "still going")  # stopped while reasoning: no answer
    assert split_thinking("Paris") == ("Paris", None)
    assert split_thinking("The answer uses a <think> tag: yes") == ("The answer uses a <think> tag: yes", None)
    # (a <think> the user wrote in a prompt is not reasoning: only the trained spans are cut)
    text = "user: What does <think> do?\nassistant: <think>hmm</think> It marks reasoning."
    answer = text.index("<think>hmm")
    assert without_thinking(text, [(answer, len(text))]) == [(text.index("It marks"), len(text))]


class _Reasoner(BaseHTTPRequestHandler):
    """A chat-completions server whose answers start with a <think> block (a reasoning model served without a
    reasoning parser), one of them cut off mid-thought."""

    def log_message(self, *args):
        pass

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "served", "object": "model", "owned_by": "test"}]})

    def do_POST(self):
        question = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"][-1]["content"]
        answer = {"France": "<think>France: Paris.</think>\n\nParis", "Peru": "<think>Peru... Lima? Or",
                  "Italy": "Rome"}[next(c for c in ("France", "Peru", "Italy") if c in question)]  # fmt: skip
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "served", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]})  # fmt: skip


def test_reasoning_in_benchmark_answers_is_taken_out_before_scoring_and_counted(workdir):
    from leap_finetune.evaluation.standalone import evaluate_config

    rows = [{"messages": [{"role": "user", "content": f"Capital of {country}?"}, {"role": "assistant",
             "content": capital}]} for country, capital in (("France", "Paris"), ("Peru", "Lima"), ("Italy", "Rome"))]  # fmt: skip
    write_jsonl(workdir / "bench.jsonl", rows)
    config = write_config(workdir, {"model_name": "tiny-lfm2", "evals": {"benchmarks": [
        {"name": "capitals", "path": "bench.jsonl", "metric": "exact_match"}]}})  # fmt: skip
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Reasoner)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        results = evaluate_config(config, output=workdir / "r.json", server=url)["results"]
    finally:
        httpd.shutdown()
    # Paris (after its reasoning) and Rome are right; Lima never came (cut off while reasoning)
    assert results["benchmark/capitals/score"] == pytest.approx(2 / 3)
    assert results["benchmark/capitals/thinking"] == 2
    predictions = [json.loads(line) for line in (workdir / "r.predictions" / "capitals.jsonl").read_text().splitlines()]
    assert [p["prediction"] for p in predictions] == ["Paris", "", "Rome"]
    assert predictions[0]["thinking"] == "France: Paris." and "thinking" not in predictions[2]
