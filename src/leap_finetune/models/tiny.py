"""Built-in offline tiny models: `tiny-lfm2`, `tiny-lfm2.5`, `tiny-lfm2-moe` and `tiny-lfm2.5-vl`.

A real LFM2 architecture (mixed short-convolution and attention layers) with random weights and a
byte-level BPE tokenizer that ships inside the package, with LFM2's special tokens at their real
ids. They need no network, train a step in milliseconds on a CPU, and are what the tests and the
quickstart use. `tiny-lfm2` carries the LFM2 chat template, `tiny-lfm2.5` LFM2.5's.

`tiny-lfm2.5-vl` is a real LFM2-VL architecture (a SigLIP2 vision encoder, the pixel-unshuffle
projector and the tiny LFM2 as language model) with LFM2-VL's processor and image tokens; its
image processor makes small images (4-16 image tokens) so that image benchmarks run on a CPU.

`tiny-lfm2-moe` is LFM2-MoE (LFM2-8B-A1B's architecture: dense first layer, then sparse MoE layers with sigmoid
top-k routing and expert bias) with four experts, two per token, and tiny-lfm2's tokenizer and template.
"""

from __future__ import annotations

from importlib import resources

TINY_MODELS = {"tiny-lfm2": "lfm2", "tiny-lfm2.5": "lfm2.5", "tiny-lfm2-moe": "lfm2", "tiny-lfm2.5-vl": "lfm2.5"}
TINY_VISION_MODELS = {"tiny-lfm2.5-vl"}
# config.json's model_type of each (models/architectures.py)
TINY_MODEL_TYPES = {
    "tiny-lfm2": "lfm2",
    "tiny-lfm2.5": "lfm2",
    "tiny-lfm2-moe": "lfm2_moe",
    "tiny-lfm2.5-vl": "lfm2_vl",
}
# LFM2-VL's image tokens (the processor expands one <image> into start, tiles or thumbnail, end).
IMAGE_TOKENS = ["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"] + [
    f"<|img_row_{row}_col_{col}|>" for row in range(1, 4) for col in range(1, 4)
]
TINY_VISION = {
    "model_type": "siglip2_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "patch_size": 16,
    "vision_use_head": False,
}
TINY_IMAGE_PROCESSOR = {
    "do_image_splitting": False,
    "min_image_tokens": 4,
    "max_image_tokens": 16,
    "encoder_patch_size": 16,
    "downsample_factor": 2,
}

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
# LFM2-MoE's shape in small: the first layer dense (LFM2-8B-A1B: 2 of 24), the others 4 experts, 2 per token
TINY_MOE_ARCH = {
    **{k: v for k, v in TINY_ARCH.items() if k != "block_auto_adjust_ff_dim"},
    "moe_intermediate_size": 96,
    "num_dense_layers": 1,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "use_expert_bias": True,
    "norm_topk_prob": True,
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
    if name in TINY_VISION_MODELS:
        tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    return tokenizer


def build_tiny_processor(tokenizer):
    """LFM2-VL's processor around the tiny tokenizer (needs torchvision, like the real one)."""
    from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor

    return Lfm2VlProcessor(
        image_processor=Lfm2VlImageProcessor(**TINY_IMAGE_PROCESSOR),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def build_tiny_model(name: str, tokenizer, dtype=None, arch: dict | None = None):
    """`arch`: TINY_ARCH's values to change (a wider or shallower tiny LFM2 for a test)."""
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from leap_finetune.models.lfm2_keys import add_original_lfm2_keys, load_published_vision_names

    config = Lfm2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **{**TINY_ARCH, **(arch or {})},
    )
    if name == "tiny-lfm2-moe":
        from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

        config = Lfm2MoeConfig(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
            **TINY_MOE_ARCH,
        )
        model_class = Lfm2MoeForCausalLM
    elif name in TINY_VISION_MODELS:
        from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

        patches = TINY_IMAGE_PROCESSOR["max_image_tokens"] * TINY_IMAGE_PROCESSOR["downsample_factor"] ** 2
        config = Lfm2VlConfig(
            text_config=config.to_dict(),
            vision_config={**TINY_VISION, "num_patches": patches},
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            projector_hidden_size=64,
            downsample_factor=TINY_IMAGE_PROCESSOR["downsample_factor"],
            tie_word_embeddings=True,
        )
        model_class = Lfm2VlForConditionalGeneration
    else:
        model_class = Lfm2ForCausalLM
    # Seeded so that every run of a tiny model starts from the same weights (reproducible tests).
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = model_class(config)
    if dtype is not None:
        model = model.to(dtype)
    add_original_lfm2_keys(model.config)  # vLLM's LFM2 reads them
    load_published_vision_names(model)
    model.config.name_or_path = name
    return model
