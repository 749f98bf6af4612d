"""Build the byte-level BPE tokenizer that ships with the built-in tiny models.

Run once when the special tokens change; the result is committed as
src/leap_finetune/models/assets/tiny_tokenizer.json. Byte-level BPE can encode any text, so the
small training corpus only affects how long sequences are, never whether they can be encoded.
The special tokens sit at the ids real LFM2 checkpoints use, so masks and tool-call markers
behave exactly as with LiquidAI/LFM2-*.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = [
    "<|pad|>",  # 0
    "<|startoftext|>",  # 1 (bos)
    "<|endoftext|>",  # 2
    "<|fim_pre|>",  # 3
    "<|fim_mid|>",  # 4
    "<|fim_suf|>",  # 5
    "<|im_start|>",  # 6
    "<|im_end|>",  # 7 (eos of the instruct models)
    "<|tool_list_start|>",  # 8
    "<|tool_list_end|>",  # 9
    "<|tool_call_start|>",  # 10
    "<|tool_call_end|>",  # 11
    "<|tool_response_start|>",  # 12
    "<|tool_response_end|>",  # 13
]

CORPUS = """
system user assistant tool You are a helpful assistant. What is the capital of France? The capital of France is Paris.
Answer briefly. Question answer reply hello hi thanks please explain why how when where who which
List of tools: get_weather(location="Boston") temperature sunny cloudy rain degrees
def function return import class self print True False None [] {} () = , . : ; ' " \\n
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000
country capital city Germany Berlin Italy Rome Spain Madrid Japan Tokyo Canada Ottawa Kenya Nairobi
color red green blue yellow orange purple black white fruit banana apple cherry lemon grape
"""


def main() -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS] * 50, trainer=trainer)
    for i, tok in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(tok) == i, tok
    out = Path(__file__).resolve().parents[1] / "src/leap_finetune/models/assets/tiny_tokenizer.json"
    tokenizer.save(str(out))
    print(f"wrote {out} ({tokenizer.get_vocab_size()} tokens)")


if __name__ == "__main__":
    main()
