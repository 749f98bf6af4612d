"""`chat` answers from a trained model; `export --merge` writes base + adapter as one full model; the model card's
snippet runs as pasted."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import fact_rows, invoke, tiny_config, train_full_and_lora, write_config, write_jsonl


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A full fine-tune that learns `Say W twice.` -> `W W`, and a LoRA run, both through the CLI."""
    folder = tmp_path_factory.mktemp("chat")
    write_jsonl(folder / "train.jsonl", fact_rows(48))
    full = write_config(
        folder,
        tiny_config(
            data="train.jsonl",
            project_name="full",
            training_config={
                "max_steps": 90,
                "learning_rate": 3e-3,
                "per_device_train_batch_size": 8,
                "save_steps": 45,
                "warmup_steps": 0,
            },
        ),
        name="full.yaml",
    )
    full_run, lora_run = train_full_and_lora(folder, full)
    return {"full": full_run, "lora": lora_run, "folder": folder}


def test_chat_prompt_answers_from_the_trained_model(trained):
    for word in ("gold", "teal"):
        result = invoke("chat", str(trained["full"]), "--prompt", f"Say {word} twice.", "--max-new-tokens", "8")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{word} {word}"
    # a checkpoint of the same run (before the end) and a LoRA run's adapter load too
    checkpoint = invoke(
        "chat", str(trained["full"] / "checkpoint-45"), "--prompt", "Say red twice.", "--max-new-tokens", "4"
    )
    assert checkpoint.returncode == 0, checkpoint.stderr
    adapter = invoke(
        "chat", str(trained["lora"] / "checkpoint-4"), "--prompt", "Say red twice.", "--max-new-tokens", "4"
    )
    assert adapter.returncode == 0, adapter.stderr
    missing = invoke("chat", str(trained["folder"] / "nowhere"), "--prompt", "hi")
    assert missing.returncode == 2 and "no such folder" in missing.stderr


def test_export_merge_equals_base_plus_adapter(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from leap_finetune.models.loading import load_model
    from leap_finetune.models.tiny import load_tiny_tokenizer

    checkpoint = trained["lora"] / "checkpoint-4"  # an adapter, not yet merged (the run's model/ is)
    out = trained["folder"] / "merged"
    result = invoke("export", str(checkpoint), "--merge", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert (out / "config.json").exists() and not (out / "adapter_config.json").exists()
    assert (
        "<|im_start|>" in json.loads((out / "tokenizer_config.json").read_text()).get("chat_template", "")
        or (out / "chat_template.jinja").exists()
    )
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    base = load_model("tiny-lfm2", tokenizer)
    reference = PeftModel.from_pretrained(base, str(checkpoint)).eval()
    ids = tokenizer(
        "<|im_start|>user\nSay gold twice.<|im_end|>\n<|im_start|>assistant\n",
        return_tensors="pt",
        add_special_tokens=False,
    )["input_ids"]
    with torch.no_grad():
        expected, got = reference(ids).logits, merged(ids).logits
        with reference.disable_adapter():
            untrained = reference(ids).logits
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the adapter changed the model: it was merged
    # without --merge: the adapter as it is; an existing folder is not overwritten
    adapter_only = invoke("export", str(checkpoint), "--output", str(trained["folder"] / "adapter-copy"))
    assert adapter_only.returncode == 0 and (trained["folder"] / "adapter-copy" / "adapter_config.json").exists()
    again = invoke("export", str(checkpoint), "--merge", "--output", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr


def test_the_model_cards_are_valid_and_their_snippets_run_as_pasted(trained):
    """The card of a full run's model/, a LoRA run's adapter/ (peft over the base) and its merged model/: valid
    Hub metadata, the sections, and the snippet run as written (each in a fresh namespace, printing its answer)."""
    import contextlib
    import io
    import re

    from huggingface_hub import ModelCard

    snippets = []
    for kind, folder in (("full", "model"), ("lora", "adapter"), ("lora", "model")):
        run_dir = trained[kind]
        card = ModelCard.load(run_dir / folder / "README.md")
        assert "leap-finetune" in card.data.tags and "sft" in card.data.tags
        assert card.data.library_name == ("peft" if folder == "adapter" else "transformers")
        assert card.data.pipeline_tag == "text-generation"
        text = card.text
        for part in (
            "## Data",
            "## Training",
            "## Results",
            "## Use it",
            "resolved_config.yaml",
            str(trained["folder"] / "train.jsonl"),
            "| 48 | 48 | 48 | 0 |",
        ):
            assert part in text, part
        assert ("LoRA (r=8" in text) == (kind == "lora")
        [code] = re.findall(r"```python\n(.*?)```", text, re.S)
        assert ("PeftModel" in code) == (folder == "adapter")
        snippets.append(code)
    assert (trained["full"] / "README.md").read_text() == (trained["full"] / "model" / "README.md").read_text()
    for code in snippets:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "model card snippet", "exec"), {})  # noqa: S102 - the card's code, as a user runs it
        assert out.getvalue().endswith("\n")  # it printed the model's answer


def test_every_saved_lfm2_model_carries_the_config_keys_vllm_reads(trained):
    """vLLM's LFM2 reads the original LFM2 keys (conv_dim, block_dim, ...) that transformers' Lfm2Config does not
    write: a model without them fails in vLLM with an AttributeError (measured on the H200). The tiny model, its
    checkpoints, a run's model/, a merged LoRA run and a merged export all carry them, equal to transformers' own
    values."""
    merged = trained["folder"] / "merged-for-vllm"
    assert invoke("export", str(trained["lora"] / "checkpoint-4"), "--merge", "--output", str(merged)).returncode == 0
    for folder in (trained["full"] / "model", trained["full"] / "checkpoint-45", trained["lora"] / "model", merged):
        config = json.loads((folder / "config.json").read_text())
        attention = [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"]
        assert {
            key: config.get(key)
            for key in ("conv_dim", "conv_dim_out", "block_dim", "block_ff_dim", "block_norm_eps", "full_attn_idxs")
        } == {
            "conv_dim": config["hidden_size"],
            "conv_dim_out": config["hidden_size"],
            "block_dim": config["hidden_size"],
            "block_ff_dim": config["intermediate_size"],
            "block_norm_eps": config["norm_eps"],
            "full_attn_idxs": attention,
        }, folder
