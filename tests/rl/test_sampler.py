"""leap-finetune's GRPO decoding loop (rl/sampler.py) samples what transformers' generate samples: the same
forward (static cache, left padding, positions), the same logits processors, the same categorical draw - and
leaves the rollout to generate for any setting it does not apply. Real tiny LFM2 models on the CPU; the CUDA-graph
path is the same code compiled, measured on the H200 (bench/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer
from leap_finetune.rl.sampler import (
    LENGTH_BUCKET,
    STOP_CHECK_EVERY,
    Sampler,
    logits_processors,
    why_not,
    why_not_config,
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer("tiny-lfm2")


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    model = build_tiny_model("tiny-lfm2", tokenizer).eval()
    with torch.no_grad():  # (at the tiny init every row repeats one token: larger weights give varied text)
        for parameter in model.parameters():
            parameter.mul_(8)
    return model


def left_padded(tokenizer, lengths: list[int], seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(10, 400, (length,), generator=generator)
        mask[row, width - length :] = 1
    return ids, mask


def cut_at_end(rows: torch.Tensor, end: int) -> list[list[int]]:
    return [row[: row.index(end) + 1] if end in row else row for row in rows.tolist()]


def config(tokenizer, **settings) -> GenerationConfig:
    return GenerationConfig(
        **{
            "do_sample": True,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": [tokenizer.eos_token_id],
            "cache_implementation": "static",
            **settings,
        }
    )


@pytest.mark.parametrize("new_tokens", [40, LENGTH_BUCKET + 7])
def test_the_loop_decodes_what_generate_decodes(model, tokenizer, new_tokens):
    """top_k 1 makes both draws deterministic: every token of every left-padded row must be generate's."""
    ids, mask = left_padded(tokenizer, [5, 9, 3, 9, 7, 1, 12, 2], seed=2)
    settings = config(tokenizer, top_k=1, temperature=0.7, max_new_tokens=new_tokens)
    expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=settings)[:, ids.shape[1] :]
    got = Sampler(model, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id).generate(ids, mask, new_tokens)
    ended = cut_at_end(expected, tokenizer.eos_token_id)
    assert cut_at_end(got, tokenizer.eos_token_id) == ended
    # (the comparison covers both kinds of row: ended early, and ran to the length limit)
    assert any(len(row) < new_tokens for row in ended) and any(len(row) == new_tokens for row in ended)


def test_one_sampler_serves_prompts_of_other_lengths_and_batches(model, tokenizer):
    """The static caches are kept and reset between rollouts: a second rollout of another shape, then the first
    shape again, decode exactly as fresh ones."""
    settings = config(tokenizer, top_k=1, max_new_tokens=24)
    sampler = Sampler(model, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    for lengths in ([4, 8, 2], [30, 1, 6, 6, 11], [4, 8, 2]):
        ids, mask = left_padded(tokenizer, lengths, seed=len(lengths))
        expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=settings)[:, ids.shape[1] :]
        assert cut_at_end(sampler.generate(ids, mask, 24), tokenizer.eos_token_id) == cut_at_end(
            expected, tokenizer.eos_token_id
        )
    assert len(sampler._caches) == 2  # (3, 64) and (5, 64): reused, not rebuilt
    first = sampler._caches[(3, 64)]
    ids, mask = left_padded(tokenizer, [70, 3, 9])  # a third shape: the least recently used cache goes
    sampler.generate(ids, mask, 24)
    assert list(sampler._caches) == [(3, 64), (3, 128)] and sampler._caches[(3, 64)] is first


def test_the_draw_follows_the_processed_distribution(model, tokenizer):
    """temperature, top-k and top-p as generate applies them; the exponential race then draws each token with
    its probability, and never one the processors removed."""
    settings = config(tokenizer, temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=4)
    sampler = Sampler(model, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    torch.manual_seed(3)
    logits = torch.randn(1, 12) * 2
    _, processors = logits_processors(model, settings, prompt_length=1)
    assert [type(p).__name__ for p in processors] == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]
    expected = processors(None, logits.clone()).softmax(-1)[0]
    draws = 40_000
    rows = logits.expand(draws, 12).clone()
    picked, _ = sampler._pick(rows, torch.empty_like(rows).exponential_())
    frequency = torch.bincount(picked, minlength=12).float() / draws
    assert (expected == 0).sum() >= 6  # top-k and top-p removed tokens ...
    assert frequency[expected == 0].sum() == 0  # ... and none of them was drawn
    assert torch.allclose(frequency, expected, atol=0.01), (frequency, expected)


def test_each_drawn_token_comes_with_its_log_probability_under_the_processed_distribution(model, tokenizer):
    """The sampling log-probabilities (what vLLM returns, and TRL's off-policy mask reads): equal to the model's
    own teacher-forced log-probabilities of the drawn completion, after temperature, top-k and top-p."""
    settings = config(tokenizer, temperature=0.7, top_k=8, top_p=0.95, max_new_tokens=12)
    ids, mask = left_padded(tokenizer, [4, 9, 2], seed=4)
    torch.manual_seed(5)
    tokens, logps = Sampler(model, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id).generate(
        ids, mask, 12, logprobs=True
    )
    assert logps.shape == tokens.shape and logps.dtype == torch.float32
    _, processors = logits_processors(model, settings, prompt_length=1)
    full = torch.cat([ids, tokens], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=positions).logits.float()
    expected = torch.stack(
        [
            processors(None, logits[:, ids.shape[1] - 1 + i]).log_softmax(-1).gather(-1, tokens[:, i : i + 1])[:, 0]
            for i in range(tokens.shape[1])
        ],
        dim=1,
    )
    assert torch.isfinite(logps).all() and (logps <= 0).all()
    assert torch.allclose(logps, expected, atol=1e-4), (logps - expected).abs().max()
    assert logps.std() > 0.1  # (a real spread of probabilities, not a constant that would match by chance)


def test_the_loop_stops_once_every_sequence_has_ended(model, tokenizer):
    """A model that always says the end token: the rollout stops at the first check, not at max_new_tokens."""
    import copy

    ending = copy.deepcopy(model)
    with torch.no_grad():
        ending.lm_head.weight[tokenizer.eos_token_id] *= 1000  # (tied: the embedding row grows too)
    ids, mask = left_padded(tokenizer, [3, 6])
    settings = config(tokenizer, max_new_tokens=4 * STOP_CHECK_EVERY)
    got = Sampler(ending, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id).generate(ids, mask, 64)
    assert got.shape == (2, STOP_CHECK_EVERY)
    assert (got[:, 0] == tokenizer.eos_token_id).all()


@pytest.mark.parametrize(
    "settings, reason",
    [
        ({"min_p": 0.1}, "MinPLogitsWarper"),
        ({"repetition_penalty": 1.1}, "RepetitionPenaltyLogitsProcessor"),
        ({"begin_suppress_tokens": [5]}, "SuppressTokensAtBeginLogitsProcessor"),
        ({"cache_implementation": None}, "cache_implementation is not static"),
        ({"do_sample": False}, "do_sample is false"),
        ({"num_beams": 2}, "generation mode beam_sample"),
        ({"num_return_sequences": 2}, "one sequence per prompt"),
    ],
)
def test_settings_the_loop_does_not_apply_leave_the_rollout_to_generate(model, tokenizer, settings, reason):
    assert reason in why_not(model, config(tokenizer, **settings))
    assert why_not(model, config(tokenizer, temperature=0.9, top_p=0.95, top_k=40)) is None


def test_the_config_alone_predicts_the_engine():
    """What plan and the config table say before any model is loaded."""
    static = {"cache_implementation": "static"}
    assert why_not_config(static) is None
    assert why_not_config({**static, "temperature": 0.8, "top_p": 0.9, "repetition_penalty": 1.0}) is None
    assert "min_p" in why_not_config({**static, "min_p": 0.05})
    assert "repetition_penalty" in why_not_config({**static, "repetition_penalty": 1.2})
    assert "generation_kwargs" in why_not_config({**static, "generation_kwargs": {"typical_p": 0.9}})
    assert why_not_config({}) == "cache_implementation is not static"
    assert why_not_config(static, vision=True) is None  # (LFM2-VL's pictures: read by the prefill)


def test_the_rollout_copy_decodes_like_the_model_and_follows_its_training(model, tokenizer):
    """On a GPU the loop decodes with a copy of the policy (half precision there; float32 here, so the tokens can
    be compared exactly) refreshed from the trained weights at every rollout, with its own attention for one new
    token. A change to the trained weights shows in the next rollout."""
    import copy

    trained = copy.deepcopy(model)
    settings = config(tokenizer, top_k=1, max_new_tokens=30)
    sampler = Sampler(trained, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id, rollout_dtype=torch.float32)
    assert sampler.policy is not trained
    assert sampler.policy.config._attn_implementation == "leap_decode"
    assert trained.config._attn_implementation != "leap_decode"  # training keeps its attention
    ids, mask = left_padded(tokenizer, [5, 9, 3, 9, 7, 1, 12, 2], seed=2)
    for _ in range(2):
        expected = trained.generate(input_ids=ids, attention_mask=mask, generation_config=settings)[:, ids.shape[1] :]
        assert cut_at_end(sampler.generate(ids, mask, 30), tokenizer.eos_token_id) == cut_at_end(
            expected, tokenizer.eos_token_id
        )
        with torch.no_grad():  # "a training step": the next rollout must see it
            trained.model.layers[-1].feed_forward.w2.weight.mul_(-1.5)


def test_the_decode_attention_equals_sdpa_for_one_new_token():
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from leap_finetune.rl.sampler import decode_attention

    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 8, 2, 10, 16
    query = torch.randn(batch, heads, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[0, ..., :4] = False  # left padding
    mask[1, ..., 7:] = False  # cache slots not written yet
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = decode_attention(module, query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (batch, 1, heads, dim)
    assert torch.allclose(got, expected, atol=1e-5)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    assert torch.allclose(decode_attention(module, query, key, value, additive, scaling=0.25)[0], expected, atol=1e-5)


def test_the_rollout_copy_never_runs_the_trained_model(model, tokenizer):
    """TRL patches the model's forward with its fused LM head (a closure holding the model's own bound forward), on
    the model inside a LoRA adapter too; a deep copy keeps that closure. The copy must decode with its own modules:
    no module of the trained model runs during a rollout."""
    import copy

    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    inner = copy.deepcopy(model)
    add_fused_lm_head(inner)
    trained = get_peft_model(inner, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    sampler = Sampler(
        trained,
        config(tokenizer, top_k=1, max_new_tokens=8),
        [tokenizer.eos_token_id],
        tokenizer.pad_token_id,
        rollout_dtype=torch.bfloat16,
    )
    calls = []
    for module in trained.modules():  # (after the copy was made: hooks would be copied with it)
        module.register_forward_pre_hook(lambda *args: calls.append(1))
    ids, mask = left_padded(tokenizer, [4, 7])
    completions = sampler.generate(ids, mask, 8)
    assert completions.shape == (2, 8)
    assert calls == []
    assert {p.dtype for p in sampler.policy.parameters()} == {torch.bfloat16}


def test_a_compiled_step_that_fails_costs_speed_not_the_run(model, tokenizer):
    """The compiled step raising (a compiler that cannot trace a model) falls back to the eager step with a
    warning that says so, and the rollout decodes exactly as before."""
    settings = config(tokenizer, top_k=1, max_new_tokens=20)
    sampler = Sampler(model, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id)

    def broken(*args):
        raise RuntimeError("backend compiler failed\nmore lines")

    sampler._step = broken  # (what torch.compile's wrapper is on a GPU)
    ids, mask = left_padded(tokenizer, [5, 9, 3], seed=2)
    expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=settings)[:, ids.shape[1] :]
    with pytest.warns(
        UserWarning,
        match=r"compiled decoding step failed \(RuntimeError: backend compiler failed\); "
        r"decoding without it",
    ):
        got = sampler.generate(ids, mask, 20)
    assert cut_at_end(got, tokenizer.eos_token_id) == cut_at_end(expected, tokenizer.eos_token_id)
    assert sampler._step == sampler._decode and sampler.compile_error.startswith("RuntimeError")


@pytest.mark.parametrize("use_vllm", [True, False])
def test_out_of_gpu_memory_in_grpo_names_the_engine_share(tmp_path, use_vllm):
    """Measured on the H200: vLLM colocated at TRL's default share (0.3) left too little for full fine-tuning of
    LFM2-1.2B; the error says which keys to change, vLLM's share first."""
    from leap_finetune.errors import LeapError
    from leap_finetune.recipes.failures import disk_errors

    training = {
        "per_device_train_batch_size": 64,
        "num_generations": 8,
        "max_completion_length": 256,
        "use_vllm": use_vllm,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.3,
    }
    with pytest.raises(LeapError) as raised, disk_errors(tmp_path, training=training):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    text = str(raised.value.message) + " " + str(raised.value.fix)
    assert "out of GPU memory (per_device_train_batch_size 64, max_completion_length 256" in text
    assert (
        "vllm_gpu_memory_utilization 0.3" in text
        and "lower vllm_gpu_memory_utilization" in text
        and "use_vllm: false" in text
    ) == use_vllm
    assert "lower max_completion_length" in text


def test_quantized_weights_are_not_copied(model):
    """QLoRA: 4/8-bit weights cast to bf16 would be garbage; such a model decodes itself."""
    import copy

    from leap_finetune.rl.sampler import can_copy

    assert can_copy(model)
    packed = copy.deepcopy(model)
    packed.model.layers[0].feed_forward.w1.weight = torch.nn.Parameter(
        torch.zeros(4, 4, dtype=torch.uint8), requires_grad=False
    )
    assert not can_copy(packed)


def test_the_rollout_copy_of_an_lfm2_moe_decodes_what_generate_decodes(tokenizer):
    """LFM2-MoE (models/architectures.py: decode_attention) gets the same one-token attention in its rollout copy;
    its tokens are generate's, routed through the same experts."""
    torch.manual_seed(0)
    moe = build_tiny_model("tiny-lfm2-moe", tokenizer).eval()
    with torch.no_grad():
        for parameter in moe.parameters():
            parameter.mul_(8)
    settings = config(tokenizer, top_k=1, max_new_tokens=30)
    sampler = Sampler(moe, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id, rollout_dtype=torch.float32)
    assert sampler.policy.config._attn_implementation == "leap_decode"
    ids, mask = left_padded(tokenizer, [5, 9, 3, 9, 7, 1, 12, 2], seed=2)
    expected = moe.generate(input_ids=ids, attention_mask=mask, generation_config=settings)[:, ids.shape[1] :]
    got = sampler.generate(ids, mask, 30)
    assert cut_at_end(got, tokenizer.eos_token_id) == cut_at_end(expected, tokenizer.eos_token_id)


def test_prompts_with_pictures_decode_what_generate_decodes():
    """GRPO on pictures (LFM2-VL): the pixels go into the prefill, the decoding steps read the cache - every token is
    generate's (top_k 1), and another picture with the same text gives another completion (the pixels are read)."""
    from PIL import Image

    from leap_finetune.models.tiny import build_tiny_processor

    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    torch.manual_seed(0)
    model = build_tiny_model("tiny-lfm2.5-vl", tokenizer).eval()
    with torch.no_grad():  # (varied text, as above, at a scale where the pictures still steer the answer)
        for name, parameter in model.named_parameters():
            if "vision_tower" not in name:
                parameter.mul_(2)
    processor = build_tiny_processor(tokenizer)
    generator = torch.Generator().manual_seed(3)
    pictures = [
        Image.fromarray((torch.rand(64, 64, 3, generator=generator) * 255).to(torch.uint8).numpy()) for _ in range(3)
    ]
    texts = ["<|im_start|>user\n<image>Where is it?<|im_end|>\n<|im_start|>assistant\n"] * 3
    processor.tokenizer.padding_side = "left"
    inputs = processor(text=texts, images=[[p] for p in pictures], return_tensors="pt", padding=True)
    pixels = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    # (TRL suppresses the image token for a vision-language model: a sampled one would have no picture)
    settings = config(tokenizer, top_k=1, max_new_tokens=12, suppress_tokens=[model.config.image_token_id])
    expected = model.generate(**inputs, generation_config=settings)[:, inputs["input_ids"].shape[1] :]
    sampler = Sampler(model, settings, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    got = sampler.generate(inputs["input_ids"], inputs["attention_mask"], 12, prefill=pixels)
    assert cut_at_end(got, tokenizer.eos_token_id) == cut_at_end(expected, tokenizer.eos_token_id)
    assert len({tuple(row) for row in cut_at_end(got, tokenizer.eos_token_id)}) > 1  # the pictures changed them
    assert why_not(model, settings, multimodal=True) is None
