"""Writes dpo.jsonl and kto.jsonl: a small synthetic preference task (answer the request rather
than refuse it), in the spec's shapes - plain strings, message lists, multi-turn prompts, and DPO
rows whose prompt is implicit (shared by chosen and rejected). A tiny model learns the preference
in seconds on a CPU. Run: python examples/data/make_preference_data.py"""

import json
import random
from pathlib import Path

WORDS = ["red", "blue", "green", "gold", "pink", "gray", "teal", "navy", "lime", "plum", "rose", "sand"]
REFUSALS = ["I refuse.", "No.", "I cannot help with that.", "Ask someone else."]


def main() -> None:
    rng = random.Random(0)
    dpo, kto = [], []
    # each row a request of its own (two words of 12: 132 pairs, 120 used), so that the rows held out for evaluation
    # are requests never trained on - the preference (answer, don't refuse) is what carries over to them
    pairs = [(a, b) for a in WORDS for b in WORDS if a != b]
    rng.shuffle(pairs)
    for i, (word, other) in enumerate(pairs[:120]):
        question, answer, refusal = f"Say {word} then {other}.", f"{word} {other}", rng.choice(REFUSALS)
        shape = i % 3
        if shape == 0:  # plain strings
            dpo.append({"prompt": question, "chosen": answer, "rejected": refusal})
        elif shape == 1:  # multi-turn prompt, message-list completions
            dpo.append(
                {
                    "prompt": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi!"},
                        {"role": "assistant", "content": "Hello."},
                        {"role": "user", "content": question},
                    ],
                    "chosen": [{"role": "assistant", "content": answer}],
                    "rejected": [{"role": "assistant", "content": refusal}],
                }
            )
        else:  # implicit prompt: full conversations sharing their first turns
            user = [{"role": "user", "content": question}]
            dpo.append(
                {
                    "chosen": user + [{"role": "assistant", "content": answer}],
                    "rejected": user + [{"role": "assistant", "content": refusal}],
                }
            )
        desirable = i % 2 == 0
        kto.append(
            {
                "prompt": [{"role": "user", "content": question}],
                "completion": [{"role": "assistant", "content": answer if desirable else refusal}],
                "label": desirable,
            }
        )
    rng.shuffle(dpo)
    rng.shuffle(kto)
    folder = Path(__file__).parent
    for name, rows in (("dpo.jsonl", dpo), ("kto.jsonl", kto)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {len(rows)} rows to {folder / name}")


if __name__ == "__main__":
    main()
