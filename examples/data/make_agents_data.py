"""Writes the agents example's data (examples/agents_warmup.yaml, examples/agents_grpo.yaml; tools in
examples/agents/workbench.py): questions the tiny model can only answer with a tool - a color hidden in the row's
key-value store (`lookup`), or a product (`calculator`).

agents_sft.jsonl - tool-use traces for the warm-up, where 60% of the answers are guesses made without the tool (a model
that has seen the tools but does not rely on them); agents_prompts.jsonl - GRPO prompts (the door's and the car's
colors, products) with the solution and the row's store (the environment's reset(row) reads it);
agents_held_out.jsonl - the roof's color, which GRPO never asks: evaluated before and after."""

import json
import random
import sys
from pathlib import Path

here = Path(__file__).parent
sys.path.insert(0, str(here.parents[1] / "src"))
from leap_finetune.rl.tool_specs import ToolSource, load_toolbox  # noqa: E402

KEYS = {"door": "What color is the door?", "car": "What color is the car?", "roof": "What color is the roof?"}
COLORS = ["red", "blue", "green", "teal", "gold", "pink", "gray", "plum"]
TOOLS = load_toolbox(ToolSource("class", str(here.parent / "agents" / "workbench.py"), "Workbench"), "make").schemas


def task(rng: random.Random, keys=tuple(KEYS)) -> dict:
    store = [{"key": key, "value": rng.choice(COLORS)} for key in KEYS]
    if rng.random() < 0.75:
        item = rng.choice([s for s in store if s["key"] in keys])
        call = f'<|tool_call_start|>[lookup(key="{item["key"]}")]<|tool_call_end|>'
        return {"question": KEYS[item["key"]], "call": call, "answer": item["value"], "store": store}
    a, b = rng.randint(3, 9), rng.randint(12, 99)
    call = f'<|tool_call_start|>[calculator(expression="{a} * {b}")]<|tool_call_end|>'
    return {"question": f"What is {a} * {b}?", "call": call, "answer": str(a * b), "store": []}


def trace(item: dict, rng: random.Random) -> dict:
    user = {"role": "user", "content": item["question"]}
    if rng.random() < 0.6:  # a guess, without the tool
        guess = rng.choice(COLORS) if item["store"] else str(rng.randint(100, 999))
        return {"messages": [user, {"role": "assistant", "content": guess}], "tools": TOOLS}
    turns = [
        user,
        {"role": "assistant", "content": item["call"]},
        {"role": "tool", "content": item["answer"]},
        {"role": "assistant", "content": item["answer"]},
    ]
    return {"messages": turns, "tools": TOOLS}


def write(name: str, rows) -> None:
    with (here / name).open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def prompt_row(t: dict) -> dict:
    return {"prompt": t["question"], "solution": t["answer"], "store": t["store"]}


rng = random.Random(0)
write("agents_sft.jsonl", [trace(task(rng), rng) for _ in range(800)])
# GRPO asks about the door and the car; the roof is held out: evaluated before and after, never trained on by GRPO
write("agents_prompts.jsonl", [prompt_row(task(rng, keys=("door", "car"))) for _ in range(256)])
held_out = [t for t in (task(rng, keys=("roof",)) for _ in range(200)) if t["store"]][:32]
write("agents_held_out.jsonl", [prompt_row(t) for t in held_out])
