"""GRPO rollouts without vLLM: a decoding loop whose step (the model's one-token forward and the sampling) is
one compiled CUDA graph on a GPU, with no wait for the GPU between tokens.

Why our own loop, not transformers' `generate`: generate (5.24) compiles only the model's forward; around it,
per token, it runs in Python and in small eager kernels the logits processors, the attention-mask and position
updates, the stopping criteria and the concatenation of the growing sequence. At 64 sequences per step on an
H200 that host work costs more than the forward itself (bench/NOTES.md, "rollouts"). Here the loop only writes
the sampled token into preallocated buffers and asks whether every sequence has ended once every
`STOP_CHECK_EVERY` tokens.

What is sampled does not change: the logits processors are the ones `generate` would build for the same
generation config (`model._get_logits_processor`), and a loop is used only when that list holds nothing but
temperature, top-k, top-p and suppressed tokens (anything else - min_p, a repetition penalty - leaves the rollout
to `generate`; `why_not` says which). A token is drawn by the exponential race (argmax of p / E with
E ~ Exp(1)), which draws from the same categorical distribution as `torch.multinomial` without a host sync.

On a GPU the loop decodes with a copy of the policy in the training's half precision (`rollout_dtype`), refreshed
from the trained weights at the start of every rollout, as vLLM's engine is: trained under autocast, the fp32
master weights were otherwise cast to bf16 again at every token (~1.5 ms of a 5 ms step at 1.2B on an H200, the
profile in bench/NOTES.md). The copy's attention for one new token is `decode_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leap_finetune.models.architectures import supports

DECODE_ATTENTION = "leap_decode"  # registered with transformers' AttentionInterface (the rollout copy only)
CACHES_KEPT = 2  # static caches (and their captured graphs) kept, by batch size and length: the most recent ones
STOP_CHECK_EVERY = 16  # tokens between the one host sync that asks whether every sequence has ended
LENGTH_BUCKET = 64  # cache lengths are rounded up to this: one compiled graph per bucket, not per prompt length
# vision-language models whose pictures the sampler reads: the pixels go into the prefill only, and positions are
# plain token counts (not Qwen-VL's multimodal rotary positions, which the decoding loop does not compute)
PREFILL_PICTURES = ("lfm2_vl",)
# (SuppressTokens: TRL suppresses a vision-language model's image token - a sampled one would have no picture; like
# the three warpers it reads the scores only)
SAMPLING_PROCESSORS = (
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "SuppressTokensLogitsProcessor",
)
# torch.compile mode of the decoding step on a GPU (reduce-overhead: CUDA graphs; bench/grpo_rollout.py measures
# max-autotune, which also tunes the GEMMs of a 64-row decode step, against it)
COMPILE_MODE = "reduce-overhead"


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Attention of one new token per sequence against the static cache, with grouped-query heads folded into the
    query (no copy of the cache). Why not SDPA: compiled, transformers' SDPA path repeats every key/value head for
    each query head it serves (the whole cache copied 4x per layer per token for LFM2-1.2B), and the fused
    kernels pad a one-row query to 64 rows. Prompts (several tokens) go to SDPA as before."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    groups = heads // key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.reshape(batch, key.shape[1], groups, dim)  # [batch, kv heads, query heads per kv head, dim]
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # [batch, kv heads, groups, length]
    if attention_mask is not None:  # [batch, 1, 1, length]: True (or 0) where the token may attend
        scores = (
            scores.masked_fill(~attention_mask, float("-inf"))
            if attention_mask.dtype == torch.bool
            else scores + attention_mask.float()
        )
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # [batch, kv heads, groups, dim]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None


def _register_decode_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


def rollout_copy(model, dtype):
    """The policy for rollouts: a copy whose parameters are `dtype` (buffers such as rotary frequencies stay as they
    are), without accelerate's autocast wrapper, with `decode_attention`; `refresh` copies the weights into it."""
    import copy

    import torch

    # eval mode: no dropout while sampling (LoRA's lora_dropout), as in vLLM's engine; the trained model keeps its mode
    # (the memo hands deepcopy each parameter already cast: the copy never holds a second fp32 model)
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in model.parameters()}
    shadow = copy.deepcopy(model, memo).eval()
    # Forwards patched on instances go, at every level: accelerate's autocast wrapper (the copy is bf16 itself) and
    # TRL's fused LM head (trl add_fused_lm_head), whose closure keeps the ORIGINAL model's bound forward - a deep
    # copy rebinds the method but not the closure, so the copy would run the fp32 original (found with LoRA, where
    # TRL patches the model inside the adapter: 5k instead of 20k+ tokens/s on the H200)
    for module in shadow.modules():
        for name in ("forward", "_original_forward"):
            module.__dict__.pop(name, None)
    from leap_finetune.models import qat

    trained_qat = qat.state_of(model)
    if trained_qat is not None:  # qat: the rollouts sample from the rounded weights too, switched with training's
        qat.apply(shadow, trained_qat.target, trained_qat.start_step, state=trained_qat)
    base = shadow.get_base_model() if hasattr(shadow, "get_base_model") else shadow
    # architectures whose attention decode_attention reproduces (models/architectures.py; tested against SDPA and
    # generate); others keep their own attention in the copy (softcapping, attention sinks, ... are theirs)
    if supports(getattr(base.config, "model_type", None), "decode_attention"):
        _register_decode_attention()
        base.set_attn_implementation(DECODE_ATTENTION)
    return shadow


def can_copy(model) -> bool:
    """A half-precision copy only of plain floating-point weights (not 4/8-bit quantized ones: QLoRA decodes with
    the trained model itself)."""
    return not getattr(model, "is_quantized", False) and all(p.is_floating_point() for p in model.parameters())


def refresh(shadow, model) -> None:
    import torch

    with torch.no_grad():
        torch._foreach_copy_(list(shadow.parameters()), list(model.parameters()))


def logits_processors(model, generation_config, prompt_length: int):
    """The processors `generate` would apply for this config (the model's own generation config merged in)."""
    config, _ = model._prepare_generation_config(generation_config)
    return config, model._get_logits_processor(config, input_ids_seq_length=prompt_length)


def why_not(model, generation_config, *, multimodal: bool = False) -> str | None:
    """Why this model and generation config need transformers' generate; None when the loop here can sample."""
    if multimodal and getattr(model.config, "model_type", None) not in PREFILL_PICTURES:
        return f"prompts with pictures on a {getattr(model.config, 'model_type', 'model')}: the sampler reads the pixels of LFM2-VL only"
    if getattr(generation_config, "cache_implementation", None) != "static":
        return "cache_implementation is not static"
    if getattr(model.config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    config, _ = model._prepare_generation_config(generation_config)
    if not config.do_sample:
        return "do_sample is false"
    from transformers.generation.configuration_utils import GenerationMode

    mode = config.get_generation_mode()
    if mode != GenerationMode.SAMPLE or (config.num_return_sequences or 1) > 1:
        return f"generation mode {getattr(mode, 'value', mode)} (the loop samples one sequence per prompt)"
    processors = model._get_logits_processor(config, input_ids_seq_length=1)
    others = [type(p).__name__ for p in processors if type(p).__name__ not in SAMPLING_PROCESSORS]
    if others:
        return f"generation settings the loop does not apply ({', '.join(others)})"
    return None


def why_not_config(training: dict, *, vision: bool = False) -> str | None:
    """`why_not` from the config alone (for plan and the config table, before a model is loaded): the trainer
    asks again with the model's own generation config merged in, and prints the engine it uses. (`vision`: the
    sampler reads LFM2-VL's pictures; another vision-language architecture is said by the trainer.)"""
    if training.get("cache_implementation") != "static":
        return "cache_implementation is not static"
    settings = {
        "min_p": training.get("min_p") not in (None, 0, 0.0),
        "repetition_penalty": training.get("repetition_penalty") not in (None, 1, 1.0),
        "generation_kwargs": bool(training.get("generation_kwargs")),
    }
    named = [name for name, used in settings.items() if used]
    return f"generation settings the loop does not apply ({', '.join(named)})" if named else None


class _Restart(Exception):
    """The compiled step failed: the rollout is decoded again from its start without it."""


@dataclass
class Sampler:
    """Samples completions for left-padded prompts; one per training process, reused across steps (the static
    caches and the compiled step are kept per batch size and cache length)."""

    model: object
    generation_config: object
    eos_token_ids: list[int]
    pad_token_id: int
    compile: bool = False
    rollout_dtype: object = None  # decode with a copy of the model in this dtype (see the module's doc)
    _caches: dict = field(default_factory=dict)
    _step: object = None
    _processors: object = None
    compile_error: str | None = None  # why the compiled step was given up for the eager one (printed once)

    def __post_init__(self):
        import torch

        _, self._processors = logits_processors(self.model, self.generation_config, prompt_length=1)
        self.policy = self.model
        if self.rollout_dtype is not None and can_copy(self.model):
            self.policy = rollout_copy(self.model, self.rollout_dtype)
        if self.compile:  # (each batch size and length bucket is a graph of its own)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # (reduce-overhead: CUDA graphs; the cache tensors are marked static by transformers' StaticCache, so the
        # graph writes into them in place)
        self._step = torch.compile(self._decode, mode=COMPILE_MODE, dynamic=False) if self.compile else self._decode

    def _pick(self, logits, noise):
        """The drawn token and its log-probability under the processed distribution (what vLLM returns as the
        sampling logprob: the trainer compares it with its own, bench/NOTES.md)."""
        import torch

        scores = logits
        for processor in self._processors:  # (temperature, top-k, top-p: they read the scores only)
            scores = processor(None, scores)
        probs = scores.softmax(-1)
        token = (probs / noise).argmax(-1)
        return token, torch.log(probs.gather(-1, token[:, None])[:, 0])

    def _decode(self, token, positions, mask, cache, noise):
        logits = (
            self.policy(
                input_ids=token,
                position_ids=positions,
                attention_mask=mask,
                cache=cache,
                logits_to_keep=1,
                use_cache=True,
            )
            .logits[:, -1]
            .float()
        )
        return self._pick(logits, noise)

    def _next(self, token, position, mask, cache, noise):
        import torch

        if self._step is self._decode:
            return self._decode(token, position, mask, cache, noise)
        torch.compiler.cudagraph_mark_step_begin()
        try:
            # (the step's outputs live in the graph's own memory until the next replay: copied out at once)
            return tuple(out.clone() for out in self._step(token, position, mask, cache, noise))
        except Exception as err:
            if isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err):
                raise  # (not the compiler's: the run's own out-of-memory error says what to change)
            import warnings

            self.compile_error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            warnings.warn(
                f"GRPO rollouts: the compiled decoding step failed ({self.compile_error}); decoding "
                "without it (slower) from here on",
                stacklevel=2,
            )
            self._step = self._decode
            raise _Restart from err  # (the cache may hold part of the failed step: the rollout starts again)

    def _cache(self, batch: int, length: int):
        from transformers import StaticCache

        key = (batch, length)
        cache = self._caches.pop(key, None)
        if cache is None:
            # (kept, not rebuilt: a compiled graph holds the addresses of the cache tensors it was captured with)
            while len(self._caches) >= CACHES_KEPT:  # the least recently used goes (its memory with it)
                self._caches.pop(next(iter(self._caches)))
            cache = StaticCache(config=self.policy.config, max_cache_len=length)
        else:
            cache.reset()
        self._caches[key] = cache  # (re-inserted: the dict's order is the order of use)
        return cache

    def generate(
        self, input_ids, attention_mask, max_new_tokens: int, *, logprobs: bool = False, prefill: dict | None = None
    ):
        """Completion token ids [batch, n <= max_new_tokens] for left-padded prompts; what follows a sequence's end
        token is whatever was sampled (the caller cuts at the first end token, as after generate). With
        `logprobs`: (ids, the log-probability of each drawn token under the processed distribution, float32).
        `prefill`: inputs the prompt's forward takes beside its tokens - a vision-language model's pixel values
        (their features go into the cache with the prompt; the decoding steps read tokens only)."""
        try:
            ids, logps = self._generate(input_ids, attention_mask, max_new_tokens, prefill or {})
        except _Restart:
            ids, logps = self._generate(input_ids, attention_mask, max_new_tokens, prefill or {})
        return (ids, logps) if logprobs else ids

    def _generate(self, input_ids, attention_mask, max_new_tokens: int, prefill: dict):
        import torch

        batch, prompt_length = input_ids.shape
        device = input_ids.device
        length = -(-(prompt_length + max_new_tokens) // LENGTH_BUCKET) * LENGTH_BUCKET
        cache = self._cache(batch, length)
        mask = torch.zeros(batch, length, dtype=attention_mask.dtype, device=device)
        mask[:, :prompt_length] = attention_mask
        # positions as generate computes them for left padding: the count of real tokens before each one
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = torch.full((batch, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros(batch, max_new_tokens, dtype=torch.float32, device=device)
        eos = torch.tensor(self.eos_token_ids, device=device)
        ended = torch.zeros(batch, dtype=torch.bool, device=device)
        vocab = None

        if self.policy is not self.model:
            refresh(self.policy, self.model)
        with torch.no_grad():
            # prefill: eager, once per rollout (its 2D mask must be the prompt's own length: transformers trims the
            # convolution layers' padding mask to the trailing positions of the mask it is given)
            logits = (
                self.policy(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=positions,
                    cache=cache,
                    logits_to_keep=1,
                    use_cache=True,
                    **prefill,
                )
                .logits[:, -1]
                .float()
            )
            vocab = logits.shape[-1]
            token, logp = self._pick(logits, torch.empty_like(logits).exponential_())
            token = token.view(batch, 1)
            position = positions[:, -1:] + 1
            made = max_new_tokens
            for i in range(max_new_tokens):
                out[:, i] = token[:, 0]
                logps[:, i] = logp
                ended |= torch.isin(token[:, 0], eos)
                if i + 1 == max_new_tokens:
                    break
                if (i + 1) % STOP_CHECK_EVERY == 0 and bool(ended.all()):
                    made = i + 1
                    break
                mask[:, prompt_length + i] = 1
                noise = torch.empty(batch, vocab, device=device).exponential_()
                token, logp = self._next(token, position, mask, cache, noise)
                token = token.view(batch, 1)
                position = position + 1
        return out[:, :made], logps[:, :made]
