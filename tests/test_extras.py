"""Every optional extra installs with the core pins: each is resolved (`uv pip compile`, metadata only, no wheels
downloaded) for the Pythons we support on Linux x86_64. A pin that made an extra uninstallable (as `vllm>=0.33`
against `transformers<5.25` did) fails here, not at a user's `pip install 'leap-finetune[vllm]'`.

Needs PyPI (as the set-up does); uv comes with scripts/setup.sh."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = sorted(PROJECT["optional-dependencies"])


def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    found = str(uv) if uv.exists() else shutil.which("uv")
    assert found, "uv is not installed: run bash scripts/setup.sh (it installs uv into .venv)"
    return found


PYTHONS = ["3.11", "3.12"]


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """The core dependencies with every extra at once, resolved for each Python - at the same time (each is mostly
    waiting on PyPI's answers)."""
    folder = tmp_path_factory.mktemp("extras")
    requirements = list(PROJECT["dependencies"])  # written out: compiling pyproject.toml would build the project
    for extra in EXTRAS:
        requirements += PROJECT["optional-dependencies"][extra]
    (folder / "requirements.in").write_text("\n".join(requirements) + "\n")
    running = {
        python: subprocess.Popen(
            [
                _uv(),
                "pip",
                "compile",
                "-q",
                "--python-version",
                python,
                "--python-platform",
                "x86_64-unknown-linux-gnu",
                "--no-header",
                str(folder / "requirements.in"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for python in PYTHONS
    }
    done = {}
    for python, process in running.items():
        out, err = process.communicate(timeout=900)
        done[python] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


@pytest.mark.network  # (its file is scheduled beside the Ray tests, whose processes use the CPU it leaves idle)
@pytest.mark.parametrize("python", PYTHONS)
def test_all_extras_resolve_together_with_the_core_pins(python, resolutions):
    """Adding requirements can only remove solutions, so when all of them resolve together, each extra alone does
    too (`pip install 'leap-finetune[EXTRA]'`): one resolution per Python proves them all."""
    resolved = resolutions[python]
    assert resolved.returncode == 0, f"the extras {EXTRAS} do not resolve together:\n{resolved.stderr[-3000:]}"
    versions = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", resolved.stdout, re.MULTILINE))
    assert Version(versions["vllm"]) in Requirement(_requirement("vllm")).specifier, versions["vllm"]


def _requirement(name: str) -> str:
    return next(r for extra in PROJECT["optional-dependencies"].values() for r in extra if Requirement(r).name == name)


def test_our_vllm_range_is_inside_the_range_the_installed_trl_accepts():
    """TRL refuses a vLLM outside its tested range (trl/import_utils.py); our extra must not install one."""
    import inspect

    from trl import import_utils

    source = inspect.getsource(import_utils.is_vllm_available)
    low, high = (
        Version(v)
        for v in re.search(
            r'Version\("([\d.]+)"\)\s*<=\s*_vllm_base_version\s*<=\s*Version\("([\d.]+)"\)', source
        ).groups()
    )
    ours = Requirement(_requirement("vllm")).specifier
    # every release number a vLLM could have near both ends: ours must allow none outside TRL's
    candidates = [Version(f"0.{minor}.{patch}") for minor in range(15, 45) for patch in range(6)]
    allowed = [v for v in candidates if v in ours]
    assert allowed, ours
    assert all(low <= v <= high for v in allowed), (str(ours), f"TRL accepts {low} to {high}")
