"""Writes quickstart.jsonl: a small synthetic fact-lookup task (capitals and fruit colours asked in
several phrasings). A random-init tiny model learns it in about a minute on a CPU, so the
quickstart shows learning a person can see. Run: python examples/data/make_quickstart_data.py"""

import json
import random
from pathlib import Path

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "Canada": "Ottawa",
    "Kenya": "Nairobi",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Chile": "Santiago",
    "Greece": "Athens",
}
COLOURS = {
    "banana": "yellow",
    "cherry": "red",
    "lime": "green",
    "plum": "purple",
    "orange": "orange",
    "blueberry": "blue",
    "lemon": "yellow",
    "strawberry": "red",
    "kiwi": "green",
    "grape": "purple",
}
CAPITAL_QUESTIONS = [
    "What is the capital of {}?",
    "Name the capital city of {}.",
    "Which city is the capital of {}?",
    "Tell me the capital of {}.",
]
COLOUR_QUESTIONS = ["What color is a {}?", "Which color does a {} have?", "Name the color of a {}."]


def main() -> None:
    rows = []
    for country, capital in CAPITALS.items():
        for question in CAPITAL_QUESTIONS:
            rows.append(
                [
                    {"role": "user", "content": question.format(country)},
                    {"role": "assistant", "content": f"The capital of {country} is {capital}."},
                ]
            )
    for fruit, colour in COLOURS.items():
        for question in COLOUR_QUESTIONS:
            rows.append(
                [
                    {"role": "user", "content": question.format(fruit)},
                    {"role": "assistant", "content": f"A {fruit} is {colour}."},
                ]
            )
    random.Random(0).shuffle(rows)
    for i, messages in enumerate(rows):
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Answer in one short sentence."})
    out = Path(__file__).with_name("quickstart.jsonl")
    out.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {out}")
    write_benchmarks(random.Random(1))


def write_benchmarks(rng: random.Random) -> None:
    """Two benchmarks for the quickstart's `evals:` block: answers generated and compared with
    exact_match, and log-prob multiple choice between the right and two wrong capitals."""
    generation, mcq = [], []
    capitals = list(CAPITALS.values())
    for country, capital in CAPITALS.items():
        question = CAPITAL_QUESTIONS[0].format(country)
        generation.append(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": f"The capital of {country} is {capital}."},
                ]
            }
        )
        wrong = rng.sample([c for c in capitals if c != capital], 2)
        options = [f"The capital of {country} is {c}." for c in [capital, *wrong]]
        rng.shuffle(options)
        mcq.append(
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}],
                "options": options,
                "answer_id": options.index(f"The capital of {country} is {capital}."),
            }
        )
    folder = Path(__file__).parent
    for name, rows in (("quickstart_bench_generation.jsonl", generation), ("quickstart_bench_mcq.jsonl", mcq)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {len(rows)} rows to {folder / name}")


if __name__ == "__main__":
    main()
