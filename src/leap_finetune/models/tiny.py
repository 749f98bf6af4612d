"""Built-in offline tiny models: `tiny-lfm2` and `tiny-lfm2.5`.

A real LFM2 architecture (mixed short-convolution and attention layers) with random weights and a
byte-level BPE tokenizer that ships inside the package, with LFM2's special tokens at their real
ids. They need no network, train a step in milliseconds on a CPU, and are what the tests and the
quickstart use. `tiny-lfm2` carries the LFM2 chat template, `tiny-lfm2.5` LFM2.5's.
"""

from __future__ import annotations

from importlib import resources

TINY_MODELS = {"tiny-lfm2": "lfm2", "tiny-lfm2.5": "lfm2.5"}

TINY_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "conv_L_cache": 3,
    "block_auto_adjust_ff_dim": False,
}
TINY_SEED = 1234


def load_tiny_tokenizer(name: str):
    from transformers import PreTrainedTokenizerFast

    from leap_finetune.data.chat_templates import official_template

    path = resources.files("leap_finetune.models") / "assets" / "tiny_tokenizer.json"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path),
        bos_token="<|startoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=TINY_ARCH["max_position_embeddings"],
    )
    tokenizer.chat_template = official_template(TINY_MODELS[name])
    return tokenizer


def build_tiny_model(name: str, tokenizer, dtype=None):
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **TINY_ARCH,
    )
    # Seeded so that every run of a tiny model starts from the same weights (reproducible tests).
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = Lfm2ForCausalLM(config)
    if dtype is not None:
        model = model.to(dtype)
    model.config.name_or_path = name
    return model
