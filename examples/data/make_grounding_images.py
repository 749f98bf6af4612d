"""Writes the grounding data of examples/grounding_warmup.yaml and examples/grounding_grpo.yaml: pictures with one
coloured box, a question naming its colour, and the box as the answer - `[x1, y1, x2, y2]` normalised to 0-1000,
as LFM2.5-VL writes boxes. The box sits near one of four places (a quadrant's centre, a few pixels off) so that a
tiny model can learn it on a CPU; the question names the colour, the picture says where.

- grounding_images/train/*.png + grounding_sft.jsonl (SFT rows: the question with the picture, the box as the
  answer) + grounding_prompts.jsonl (GRPO rows: the same prompts, the box as `solution`).
- grounding_images/test/*.png + grounding_bench.jsonl: held-out pictures as a benchmark (metric grounding_iou).

Run: python examples/data/make_grounding_images.py [--train 96] [--test 24]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = {"red": (210, 35, 35), "green": (40, 165, 60), "blue": (40, 70, 210), "yellow": (235, 200, 30)}
SIZE = 64


def picture(rng: random.Random, colour: str) -> tuple[Image.Image, list[int]]:
    """The picture and its box in 0-1000 coordinates."""
    image = Image.new("RGB", (SIZE, SIZE), tuple(rng.randint(225, 250) for _ in range(3)))
    side = rng.randint(22, 28)
    cx, cy = rng.choice((16, 48)) + rng.randint(-3, 3), rng.choice((16, 48)) + rng.randint(-3, 3)
    x1, y1 = max(0, cx - side // 2), max(0, cy - side // 2)
    x2, y2 = min(SIZE, x1 + side), min(SIZE, y1 + side)
    ImageDraw.Draw(image).rectangle((x1, y1, x2 - 1, y2 - 1), fill=COLOURS[colour])
    return image, [round(v * 1000 / SIZE) for v in (x1, y1, x2, y2)]


def question(colour: str) -> str:
    return f"Where is the {colour} box? Answer with [x1, y1, x2, y2] from 0 to 1000."


def write(folder: Path, split: str, count: int, rng: random.Random) -> list[tuple[str, str, list[int]]]:
    (folder / "grounding_images" / split).mkdir(parents=True, exist_ok=True)
    made = []
    for index in range(count):
        colour = list(COLOURS)[index % len(COLOURS)]
        image, box = picture(rng, colour)
        path = f"grounding_images/{split}/{index:03d}.png"
        image.save(folder / path)
        made.append((path, colour, box))
    return made


def user_turn(path: str, colour: str) -> dict:
    return {"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": question(colour)}]}


def save(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=int, default=96)
    parser.add_argument("--test", type=int, default=24)
    options = parser.parse_args()
    folder = Path(__file__).resolve().parent
    rng = random.Random(0)
    train, test = write(folder, "train", options.train, rng), write(folder, "test", options.test, rng)
    answer = json.dumps
    save(
        folder / "grounding_sft.jsonl",
        [{"messages": [user_turn(p, c), {"role": "assistant", "content": answer(b)}]} for p, c, b in train],
    )
    save(
        folder / "grounding_prompts.jsonl", [{"prompt": [user_turn(p, c)], "solution": answer(b)} for p, c, b in train]
    )
    save(
        folder / "grounding_bench.jsonl",
        [{"messages": [user_turn(p, c), {"role": "assistant", "content": answer(b)}]} for p, c, b in test],
    )


if __name__ == "__main__":
    main()
