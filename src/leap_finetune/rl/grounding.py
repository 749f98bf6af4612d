"""Grounding: boxes in a model's answer, and how well they cover the reference's - for GRPO's rewards (`iou`,
`giou`, `ciou`, `box_format`) and the benchmarks' metrics (`grounding_iou`, `iou@0.5`).

A box is four numbers `[x1, y1, x2, y2]` (left, top, right, bottom) as LFM2.5-VL writes them: in pixels or
normalised to 0-1000 - the same convention in the answer and the reference, which is all the scores need (IoU and
GIoU do not change when x and y are scaled, each by its own factor). An answer may hold several boxes: a JSON list
of boxes, objects with a `bbox` / `box` / `bbox_2d` list, or bare `[..]` groups of four numbers in the text. Several
boxes are matched one to one, best overlap first; boxes left without a partner (one too many or too few) score 0,
so the score is the sum of the matched overlaps over the larger count.

Written here because no library of the field scores free-text answers this way (torchvision's box ops take
tensors of parsed boxes: the matching and the parsing are the work). The parsing is data/boxes.py's.
"""

from __future__ import annotations

import math

from leap_finetune.data.boxes import Box, boxes_in  # noqa: F401  (the rewards' and metrics' names)


def _area(box: Box) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def iou(a: Box, b: Box) -> float:
    """Intersection over union; 0 for boxes that do not overlap or have no area (x2 <= x1 or y2 <= y1)."""
    inter = _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = _area(a) + _area(b) - inter
    return inter / union if union > 0 else 0.0


def giou(a: Box, b: Box) -> float:
    """Generalized IoU (Rezatofighi et al. 2019): IoU minus the share of the enclosing box covered by neither; in
    [-1, 1], so boxes that miss each other still score how far apart they are."""
    hull = _area((min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])))
    if hull <= 0:
        return -1.0
    inter = _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = _area(a) + _area(b) - inter
    return iou(a, b) - (hull - union) / hull


def ciou(a: Box, b: Box) -> float:
    """Complete IoU (Zheng et al. 2020): IoU minus the centres' squared distance over the enclosing box's squared
    diagonal, minus the aspect-ratio term alpha * v."""
    overlap = iou(a, b)
    diagonal = (max(a[2], b[2]) - min(a[0], b[0])) ** 2 + (max(a[3], b[3]) - min(a[1], b[1])) ** 2
    if diagonal <= 0:
        return -1.0
    centres = ((a[0] + a[2] - b[0] - b[2]) / 2) ** 2 + ((a[1] + a[3] - b[1] - b[3]) / 2) ** 2
    wa, ha, wb, hb = a[2] - a[0], a[3] - a[1], b[2] - b[0], b[3] - b[1]
    if min(wa, ha, wb, hb) <= 0:
        return overlap - centres / diagonal
    v = 4 / math.pi**2 * (math.atan(wb / hb) - math.atan(wa / ha)) ** 2
    alpha = v / (1 - overlap + v) if (1 - overlap + v) > 0 else 0.0
    return overlap - centres / diagonal - alpha * v


SCORES = {"iou": iou, "giou": giou, "ciou": ciou}


def matched(predicted: list[Box], reference: list[Box], score=iou, unmatched: float = 0.0) -> float:
    """The boxes paired one to one by best IoU first; the paired scores plus `unmatched` for every box left over,
    over the larger count."""
    # (best overlap first; pairs that do not overlap by the kind's own score - GIoU's distance -, then by position)
    pairs = sorted((-iou(p, r), -score(p, r), i, j) for i, p in enumerate(predicted) for j, r in enumerate(reference))
    used_p, used_r, total = set(), set(), 0.0
    for _, _, i, j in pairs:
        if i not in used_p and j not in used_r:
            used_p.add(i)
            used_r.add(j)
            total += score(predicted[i], reference[j])
    count = max(len(predicted), len(reference))
    total += unmatched * (count - len(used_p))
    return total / count if count else 0.0


def answer_score(answer, reference, kind: str = "iou") -> float | None:
    """How the answer's boxes cover the reference's (None: the reference has no box to compare with). An answer
    without a box scores the worst value of the kind (0 for IoU, -1 for GIoU and CIoU)."""
    expected = boxes_in(reference)
    if not expected:
        return None
    worst = 0.0 if kind == "iou" else -1.0
    given = boxes_in(answer)
    if not given:
        return worst
    return matched(given, expected, SCORES[kind], unmatched=worst)
