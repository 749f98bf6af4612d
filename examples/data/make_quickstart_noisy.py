"""Writes quickstart_noisy.jsonl: the quickstart conversations with 40% of the final words replaced by another row's
(seed 0) - answers from a weaker source, as a teacher that knows the task corrects them
(examples/distill_quickstart.yaml, docs/distillation.md).

    python examples/data/make_quickstart_noisy.py
"""

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    rng = random.Random(0)
    rows = [json.loads(line) for line in (HERE / "quickstart.jsonl").read_text().splitlines()]
    ends = [re.search(r"is (\S+)\.$", row["messages"][-1]["content"]) for row in rows]
    words = [m.group(1) for m in ends if m]
    for row, end in zip(rows, ends, strict=True):
        if end and rng.random() < 0.4:
            other = rng.choice([w for w in words if w != end.group(1)])
            answer = row["messages"][-1]["content"]
            row["messages"][-1]["content"] = answer[: end.start(1)] + other + "."
    (HERE / "quickstart_noisy.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
