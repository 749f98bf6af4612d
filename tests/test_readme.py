"""What the README says about the test suite holds: the command it gives is the one CI runs (`.ci/run`), and the
number of tests it names is within 5% of what that command collects."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
TEST_COMMAND = ".venv/bin/python -m pytest -q"


def test_the_readme_gives_the_test_command_ci_runs():
    assert f"bash scripts/setup.sh && {TEST_COMMAND}" in README
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1].strip().endswith(f"&& {TEST_COMMAND}"), ci[-1]


def _collected_by_the_readme_command(request: pytest.FixtureRequest) -> int:
    """How many tests `pytest -q` runs: this session's own count when this session is that command (no paths, no
    -k or -m; also in each pytest-xdist process, which collects everything), else a collection of its own."""
    config = request.config
    whole = (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and not config.option.markexpr
    )
    if whole:
        return len(request.session.items)
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # "987 tests collected", or "987/989 tests collected (2 deselected)" (the llama_cpp lane is not in the default run)
    return int(re.search(r"^(\d+)(?:/\d+)? tests? collected", listed, re.M).group(1))


def test_the_readme_names_the_number_of_tests_within_five_percent(request):
    said = re.search(r"\(([\d,]+) tests, about (\d+) minutes on 2 cores", README)
    assert said, "the README names the suite's size as '(N tests, about M minutes on 2 cores'"
    named, collected = int(said.group(1).replace(",", "")), _collected_by_the_readme_command(request)
    assert abs(named - collected) <= 0.05 * collected, f"the README says {named} tests; `pytest -q` runs {collected}"
