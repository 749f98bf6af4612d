"""Refit the memory estimate's constants (memory/calibration.py FIT) to its table of measured peaks (MEASURED).

    python bench/fit_memory.py            # prints the fitted constants and each row's error; changes nothing

The goal is issue #47's: every row within TOLERANCE, so the fit minimises the largest relative error (not the sum
of squares, which lets one row drift past it), from the current constants, with Nelder-Mead over their logarithms
(they stay positive; the peak's max(activations, gradients) makes the error piecewise linear, which a gradient-free
search handles). Each row is predicted through the real path: the config bench/memory.py ran, loaded as `plan`
loads it, with the model's shape from its published architecture (nothing downloaded).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def resolved_rows():
    """(row, resolved config) for each MEASURED row (tests/memory/test_calibration.py's configs)."""
    from leap_finetune.memory.calibration import MEASURED
    from tests.memory.test_calibration import measured_resolved

    folder = Path(tempfile.mkdtemp())
    return [(row, measured_resolved(row, folder)) for row in MEASURED]


def errors(constants: list[float], rows) -> list[float]:
    from leap_finetune.memory import estimate
    from leap_finetune.memory.calibration import FIT
    from leap_finetune.memory.plan import training_process_memory

    estimate.FIT = dataclasses.replace(FIT, **dict(zip(names(), constants, strict=True)))
    found = []
    for row, resolved in rows:
        predicted = training_process_memory(resolved).peak / 2**30
        found.append((predicted - row["measured_gib"]) / row["measured_gib"])
    return found


def names() -> list[str]:
    from leap_finetune.memory.calibration import Fit

    return [f.name for f in dataclasses.fields(Fit)]


def main() -> None:
    import numpy as np
    from scipy.optimize import minimize

    from leap_finetune.memory.calibration import FIT

    rows = resolved_rows()
    start = np.log([getattr(FIT, n) for n in names()])
    before = errors(list(np.exp(start)), rows)
    result = minimize(
        lambda x: max(abs(e) for e in errors(list(np.exp(x)), rows)),
        start,
        method="Nelder-Mead",
        options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-5},
    )
    fitted = list(np.exp(result.x))
    after = errors(fitted, rows)
    print(json.dumps({n: round(v, 4) for n, v in zip(names(), fitted, strict=True)}, indent=1))
    print(f"largest error: before {max(map(abs, before)):.1%}, after {max(map(abs, after)):.1%}")
    for (row, _), b, a in zip(rows, before, after, strict=True):
        label = f"{row['model']} {row['method']} {row['mode']} {row['max_length']} {row.get('settings', '')}"
        print(f"  {label:90s} measured {row['measured_gib']:6.2f}  before {b:+.1%}  after {a:+.1%}")


if __name__ == "__main__":
    main()
