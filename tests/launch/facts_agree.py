"""`plan`, what the run prints as it starts and the model card tell the same run: one micro-batch, one global batch,
one number of steps, one precision (launch/facts.py works them out once). Called by the tests that train such a
run anyway (tests/e2e/test_run_folder.py: a plain one; tests/e2e/test_batch_tokens.py: batch_tokens)."""

from __future__ import annotations

import re
from pathlib import Path


def assert_plan_run_and_card_agree(planned: dict, run_dir: Path) -> None:
    """`planned`: plan_config's report of the config, before the run; `run_dir`: the run's folder, as it finished."""
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    card = (run_dir / "README.md").read_text(encoding="utf-8")

    def one(pattern: str, text: str, where: str) -> re.Match:
        found = re.findall(pattern, text, re.M)
        assert len(found) == 1, (where, pattern, found)
        return re.search(pattern, text, re.M)

    # the run's start: the config table's batch row, the `run:` line, the `device:` line
    table = one(r"batch x accumulation\s*\S\s*(.+?) x (\d+)\s*\S\s*$", log, "train.log")
    start = log.index("\nrun: ")  # (the console wraps a long line: the `run:` line ends where `devices:` starts)
    line = " ".join(log[start : log.index("\ndevices: ", start)].split())
    run = one(r"^run: .*?, (\d+) steps of (~?\d+ \w+)( \(([^)]*)\))?", line, "the run: line")
    device = one(r"^device: (cpu|gpu), (.+)$", log, "train.log")
    # the card's Training table
    batch = one(
        r"^\| batch per device x accumulation x workers \| (.+) x (\d+) x (\d+) = (~?\d+ \w+) per step \|$",
        card,
        "card",
    )
    steps = one(r"^\| steps \| (\d+) \|$", card, "card")
    precision = one(r"^\| precision \| (.+) \|$", card, "card")

    plan = planned["batch"]
    micro_batch = str(plan["per_device"])
    assert table.group(1) == micro_batch == batch.group(1).removesuffix(" (batch_tokens)")
    assert int(table.group(2)) == plan["gradient_accumulation_steps"] == int(batch.group(2))
    assert int(batch.group(3)) == plan["workers"]
    global_batch = f"{'~' if plan['global_is_mean'] else ''}{plan['global']} {plan['unit']}"
    assert run.group(2) == global_batch == batch.group(4)
    if plan["global_is_mean"]:  # batch_tokens: the run's line says how the rows of a step are chosen
        assert run.group(4) == plan["detail"]
    assert int(run.group(1)) == planned["total_steps"] == int(steps.group(1))
    assert device.group(2) == planned["precision"] == precision.group(1)
