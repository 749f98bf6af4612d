"""Grounding scores on hand-computed cases: boxes read from answers as LFM2.5-VL writes them, IoU / GIoU / CIoU,
several boxes matched one to one, the rewards and the benchmark metrics built on them."""

from __future__ import annotations

import math

import pytest

from leap_finetune.rl.grounding import answer_score, boxes_in, ciou, giou, iou, matched


def test_boxes_are_read_from_answers_as_models_write_them():
    assert boxes_in("[10, 20, 110, 220]") == [(10, 20, 110, 220)]
    assert boxes_in('The cat: [{"label": "cat", "bbox": [1, 2, 3, 4]}, {"bbox_2d": [5, 6, 7, 8]}]') == [
        (1, 2, 3, 4),
        (5, 6, 7, 8),
    ]
    assert boxes_in("[[0, 0, 10, 10], [20, 20, 30, 30]]") == [(0, 0, 10, 10), (20, 20, 30, 30)]
    assert boxes_in("left box [0.5, 1, 2, 3.25] then junk [1, 2]") == [(0.5, 1, 2, 3.25)]
    assert boxes_in("box at (1, 2, 3, 4)") == [] and boxes_in("") == [] and boxes_in(None) == []
    assert boxes_in("[1, 2, 3, true]") == []  # (a boolean is not a coordinate)


def test_iou_giou_ciou_on_hand_computed_boxes():
    a, b = (0, 0, 10, 10), (5, 0, 15, 10)  # half overlapping: 50 / 150
    assert iou(a, b) == pytest.approx(1 / 3)
    assert giou(a, b) == pytest.approx(1 / 3)  # the enclosing box is the union: no penalty
    far = (20, 0, 30, 10)  # no overlap; enclosing 30x10 = 300, union 200
    assert iou(a, far) == 0 and giou(a, far) == pytest.approx(-100 / 300)
    # CIoU: same shapes (no aspect term), centres 10 apart, enclosing diagonal^2 = 15^2 + 10^2
    assert ciou(a, b) == pytest.approx(1 / 3 - 25 / 325)
    assert iou(a, a) == giou(a, a) == ciou(a, a) == pytest.approx(1.0)
    tall = (0, 0, 10, 20)  # aspect ratios differ: v = 4/pi^2 (atan(0.5) - atan(1))^2
    v = 4 / math.pi**2 * (math.atan(0.5) - math.atan(1.0)) ** 2
    overlap = 100 / 200
    assert ciou(a, tall) == pytest.approx(overlap - 25 / 500 - v / (1 - overlap + v) * v)
    assert iou((5, 5, 5, 9), a) == 0  # no area: never a match


def test_several_boxes_are_matched_one_to_one_and_extra_or_missing_ones_count():
    cat, dog = (0, 0, 10, 10), (20, 20, 30, 30)
    assert matched([dog, cat], [cat, dog]) == pytest.approx(1.0)  # the order does not matter
    assert matched([cat], [cat, dog]) == pytest.approx(0.5)  # one missing: 1 / 2
    assert matched([cat, dog, (50, 50, 60, 60)], [cat, dog]) == pytest.approx(2 / 3)  # one too many
    assert matched([cat, cat], [cat]) == pytest.approx(0.5)  # the same box twice matches once


def test_answer_scores_rewards_and_metrics():
    from leap_finetune.evaluation.metrics import BUILTIN
    from leap_finetune.rl.rewards import BUILTIN_REWARDS

    assert answer_score("[0, 0, 10, 10]", "[5, 0, 15, 10]") == pytest.approx(1 / 3)
    assert answer_score("no box", "[5, 0, 15, 10]") == 0.0 and answer_score("no box", "[5, 0, 15, 10]", "giou") == -1
    assert answer_score("[0, 0, 10, 10]", "no reference box") is None
    iou_reward = BUILTIN_REWARDS["iou"][0]()
    completions = [[{"role": "assistant", "content": "[0, 0, 10, 10]"}], "nothing"]  # (chat and text completions)
    assert iou_reward(completions, solution=["[5, 0, 15, 10]", "[0, 0, 1, 1]"]) == pytest.approx([1 / 3, 0.0])
    box_format = BUILTIN_REWARDS["box_format"][0]()
    assert box_format(["[0, 0, 10, 10]", "[10, 0, 0, 10]", "none"]) == [1.0, 0.0, 0.0]
    assert BUILTIN["grounding_iou"]("[0, 0, 10, 10]", "[5, 0, 15, 10]") == (pytest.approx(1 / 3), True)
    assert BUILTIN["iou@0.5"]("[0, 0, 10, 10]", "[2, 0, 12, 10]") == (1.0, True)  # IoU 80/120
    assert BUILTIN["iou@0.5"]("[0, 0, 10, 10]", "[5, 0, 15, 10]") == (0.0, True)
    assert BUILTIN["grounding_iou"]("I cannot see it", "[5, 0, 15, 10]") == (0.0, False)  # unparsed


def test_a_grounding_benchmark_whose_references_hold_no_box_is_refused(tmp_path):
    """A reference without a box would score every answer 0: a metric over nothing, said before any model loads."""
    import json

    from leap_finetune.errors import LeapError
    from leap_finetune.evaluation.runner import load_benchmarks
    from leap_finetune.validate.loader import load_config

    rows = [{"messages": [{"role": "user", "content": "Where?"}, {"role": "assistant", "content": answer}]}
            for answer in ("[1, 2, 30, 40]", "on the left")]  # fmt: skip
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"model_name": "tiny-lfm2", "evals": {"benchmarks": [
        {"name": "boxes", "path": "bench.jsonl", "metric": "grounding_iou"}]}}  # fmt: skip
    resolved = load_config(config, base_dir=tmp_path)
    with pytest.raises(
        LeapError, match=r"1 of its 2 row\(s\) have no box to score against in their reference answer.*line 2"
    ):
        load_benchmarks(resolved.evals, vision=False, model_name="tiny-lfm2")
    # a box without area (x2 < x1) scores every answer 0 too
    rows[1]["messages"][1]["content"] = "[10, 10, 5, 5]"
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(LeapError, match=r"line 2: box \[10, 10, 5, 5\] has no area \(x2 <= x1 or y2 <= y1\)"):
        load_benchmarks(resolved.evals, vision=False, model_name="tiny-lfm2")


def test_grpo_solutions_the_box_rewards_cannot_score_are_named(tmp_path):
    """A solution with no box, too few numbers or no area gave the row reward 0 for every answer (iou: a reward over
    nothing); validate names the row; under a reward that does not read boxes the same rows are fine."""
    from tests.conftest import grpo_rows_config, invoke, write_config

    rows = [{"prompt": "Where?", "solution": "[1, 2, 30, 40]"}] * 3 + [
        {"prompt": "Where?", "solution": bad} for bad in ("the red box", "[1, 2, 3]", "[500, 500, 100, 100]")
    ]
    config = grpo_rows_config(tmp_path, rows, ["iou", "box_format"])
    result = invoke("validate", str(write_config(tmp_path, config)))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said, said
    assert "g.jsonl, line 4" in said and "line 5" in said and "line 6" in said and "line 1," not in said, said
    assert "reward iou scores the answer's boxes against it" in said and "holds no box" in said
    assert "box [500, 500, 100, 100] has no area" in said
    config["rewards"] = [{"name": "length", "target_tokens": 8}]
    assert invoke("validate", str(write_config(tmp_path, config))).returncode == 0


def test_boxes_that_miss_are_paired_by_the_kinds_own_score_whatever_their_order():
    reference = [(190, 190, 200, 200), (20, 20, 30, 30)]
    predicted = [(0, 0, 10, 10), (200, 200, 210, 210)]
    assert matched(predicted, reference, giou, unmatched=-1.0) == pytest.approx(
        matched(predicted[::-1], reference, giou, unmatched=-1.0)
    )
