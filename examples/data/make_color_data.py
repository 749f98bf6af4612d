"""Writes the GRPO tiny example's data (examples/grpo_tiny_warmup.yaml, examples/grpo_tiny.yaml):
colors_sft.jsonl - "Name a color." answered with each of eight colors equally often (the warm-up teaches
the tiny model to name a color at random), and colors_prompts.jsonl - the same prompt with the solution
"teal" (GRPO's accuracy reward then teaches it to pick teal)."""

import json
import random
from pathlib import Path

COLORS = ["red", "blue", "green", "teal", "gold", "pink", "gray", "plum"]
here = Path(__file__).parent
rng = random.Random(0)
answers = COLORS * 12
rng.shuffle(answers)
with (here / "colors_sft.jsonl").open("w") as f:
    for answer in answers:
        f.write(
            json.dumps(
                {"messages": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": answer}]}
            )
            + "\n"
        )
with (here / "colors_prompts.jsonl").open("w") as f:
    for _ in range(64):
        f.write(json.dumps({"prompt": "Name a color.", "solution": "teal"}) + "\n")
