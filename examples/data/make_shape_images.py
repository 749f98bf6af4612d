"""Writes the image-training data of examples/vl_sft_images.yaml and examples/vl_dpo_images.yaml: a task only the
picture can answer. Every row asks the same question ("What colour is the shape?") about a PNG of one shape (disc,
square or triangle) in one of four colours, at a random place and size on a random light background: the text
never tells the answer, so a model that learns it reads the image.

- shape_images/train/*.png + shapes_sft.jsonl: SFT rows (the spec's messages with an image part; the path is
  relative to the JSONL file).
- shape_images/test/*.png + shapes_bench.jsonl: held-out pictures as a generation benchmark (exact_match).
- shapes_dpo.jsonl: DPO rows (the prompt with the image; chosen the right colour, rejected a wrong one) over the
  training pictures, and shapes_dpo_eval.jsonl over the held-out ones.

Run: python examples/data/make_shape_images.py [--train 96] [--test 32]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = {"red": (210, 35, 35), "green": (40, 165, 60), "blue": (40, 70, 210), "yellow": (235, 200, 30)}
SHAPES = ("disc", "square", "triangle")
QUESTION = "What colour is the shape?"


def picture(rng: random.Random, colour: str) -> Image.Image:
    size = rng.choice((48, 64, 80))
    background = tuple(rng.randint(215, 250) for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    side = rng.randint(size // 2, size - 8)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    draw = ImageDraw.Draw(image)
    shape = rng.choice(SHAPES)
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    if shape == "disc":
        draw.ellipse((x, y, x + side, y + side), fill=fill)
    elif shape == "square":
        draw.rectangle((x, y, x + side, y + side), fill=fill)
    else:
        draw.polygon([(x, y + side), (x + side, y + side), (x + side // 2, y)], fill=fill)
    return image


def write(folder: Path, split: str, count: int, rng: random.Random) -> list[tuple[str, str]]:
    (folder / "shape_images" / split).mkdir(parents=True, exist_ok=True)
    made = []
    for index in range(count):
        colour = list(COLOURS)[index % len(COLOURS)]
        path = f"shape_images/{split}/{index:03d}.png"
        picture(rng, colour).save(folder / path)
        made.append((path, colour))
    return made


def user_turn(path: str) -> dict:
    return {"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": QUESTION}]}


def dpo_rows(made: list[tuple[str, str]], rng: random.Random) -> list[dict]:
    rows = []
    for path, colour in made:
        wrong = rng.choice([c for c in COLOURS if c != colour])
        rows.append(
            {
                "prompt": [user_turn(path)],
                "chosen": [{"role": "assistant", "content": colour}],
                "rejected": [{"role": "assistant", "content": wrong}],
            }
        )
    return rows


def save(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=int, default=96)
    parser.add_argument("--test", type=int, default=32)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    options = parser.parse_args()
    folder = Path(options.out)
    rng = random.Random(7)
    train = write(folder, "train", options.train, rng)
    test = write(folder, "test", options.test, rng)
    save(
        folder / "shapes_sft.jsonl",
        [{"messages": [user_turn(p), {"role": "assistant", "content": c}]} for p, c in train],
    )
    save(
        folder / "shapes_bench.jsonl",
        [{"messages": [user_turn(p), {"role": "assistant", "content": c}]} for p, c in test],
    )
    save(folder / "shapes_dpo.jsonl", dpo_rows(train, rng))
    save(folder / "shapes_dpo_eval.jsonl", dpo_rows(test, rng))


if __name__ == "__main__":
    main()
