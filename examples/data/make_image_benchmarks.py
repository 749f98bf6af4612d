"""Writes the image benchmarks of examples/vl_quickstart.yaml: a picture of each quickstart fruit (a
disc in its colour, PNG in images/) asked about in the spec's format, once as generation
(exact_match) and once as log-prob multiple choice. Run: python examples/data/make_image_benchmarks.py"""

import json
import random
from pathlib import Path

from make_quickstart_data import COLOURS
from PIL import Image, ImageDraw

RGB = {
    "yellow": (240, 210, 40),
    "red": (200, 30, 40),
    "green": (60, 170, 60),
    "purple": (110, 40, 130),
    "orange": (245, 140, 20),
    "blue": (50, 70, 200),
}


def main() -> None:
    folder = Path(__file__).parent
    (folder / "images").mkdir(exist_ok=True)
    rng = random.Random(2)
    generation, mcq = [], []
    for fruit, colour in COLOURS.items():
        image = Image.new("RGB", (96, 96), (250, 250, 250))
        ImageDraw.Draw(image).ellipse((16, 16, 80, 80), fill=RGB[colour])
        image.save(folder / "images" / f"{fruit}.png")
        picture = {"type": "image", "image": f"images/{fruit}.png"}  # relative to this file's folder
        generation.append(
            {
                "messages": [
                    {"role": "user", "content": [picture, {"type": "text", "text": f"What color is a {fruit}?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": f"A {fruit} is {colour}."}]},
                ]
            }
        )
        wrong = rng.sample(sorted({c for c in COLOURS.values() if c != colour}), 2)
        options = [f"A {fruit} is {c}." for c in [colour, *wrong]]
        rng.shuffle(options)
        mcq.append(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [picture, {"type": "text", "text": f"Which color does a {fruit} have?"}],
                    }
                ],
                "options": options,
                "answer_id": options.index(f"A {fruit} is {colour}."),
            }
        )
    for name, rows in (("fruit_images_generation.jsonl", generation), ("fruit_images_mcq.jsonl", mcq)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {len(rows)} rows to {folder / name}")


if __name__ == "__main__":
    main()
