"""Start-up of the command line: how long `leap-finetune --help` and `leap-finetune validate CONFIG` take, and
which heavy libraries `validate` imports (issue #26: validate of the quickstart under 5 s wall on a quiet 2-core
machine, measured with a cold and a warm file cache).

Cold: the page cache dropped first (`/proc/sys/vm/drop_caches`, which needs root; without it the row says
"not measured"). Warm: the median of --runs runs after one unmeasured run. The prepared rows come from the data
cache in the warm runs (as a second `validate` finds them); the first run prepares them.

    python bench/startup.py --config examples/quickstart.yaml --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = (
    "torch",
    "transformers",
    "transformers.trainer",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "pandas",
    "sentence_transformers",
    "ray",
    "matplotlib",
    "vllm",
)


def timed(command: list[str], env: dict) -> tuple[float, float, int]:
    """(wall s, user + system CPU s of the child, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def imported_by_validate(config: str, env: dict) -> list[str]:
    code = (
        f"import sys\nfrom leap_finetune.cli import main\nsys.argv = ['leap-finetune', 'validate', {config!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules], len(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
    line = next((x for x in out.splitlines() if x.startswith("HEAVY")), "HEAVY [] 0")
    return line.removeprefix("HEAVY ")


def profile_of_validate(config: str, env: dict, top: int = 25) -> str:
    """A warm `validate` under cProfile: the functions with the most cumulative time (where the GPU machine's
    seconds go that the CPU machine does not spend - bench/NOTES.md, #48)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".prof") as out:
        subprocess.run([sys.executable, "-m", "cProfile", "-o", out.name, "-m", "leap_finetune.cli", "validate", config],
                       env=env, capture_output=True, text=True)  # fmt: skip
        code = (f"import pstats, sys\np = pstats.Stats({out.name!r}, stream=sys.stdout)\n"
                f"p.sort_stats('cumulative').print_stats({top})")  # fmt: skip
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of a warm validate")
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cli = [sys.executable, "-m", "leap_finetune.cli"]
    commands = {
        "import leap_finetune": [sys.executable, "-c", "import leap_finetune"],
        "leap-finetune --help": [*cli, "--help"],
        "leap-finetune validate": [*cli, "validate", args.config],
        "leap-finetune plan": [*cli, "plan", args.config],  # (#48: < 5 s on the GPU machine, as validate)
    }
    rows = []
    for name, command in commands.items():
        cold = None
        if drop_page_cache():
            cold = timed(command, env)
        timed(command, env)  # warm-up (and the data cache filled)
        warm = [timed(command, env) for _ in range(args.runs)]
        if any(code != 0 for _, _, code in warm):
            sys.exit(f"{name} failed: {' '.join(command)}")
        rows.append(
            {
                "command": name,
                "cold_wall_s": round(cold[0], 2) if cold else None,
                "warm_wall_s": round(statistics.median(w for w, _, _ in warm), 2),
                "warm_cpu_s": round(statistics.median(c for _, c, _ in warm), 2),
            }
        )
    print(json.dumps({"rows": rows, "validate_imports": imported_by_validate(args.config, env)}, indent=1))
    if args.profile:
        print(profile_of_validate(args.config, env))
    print("\n| command | cold wall s | warm wall s (median) | warm CPU s |\n| --- | --- | --- | --- |")
    for row in rows:
        cold = f"{row['cold_wall_s']:.2f}" if row["cold_wall_s"] is not None else "not measured (no root)"
        print(f"| `{row['command']}` | {cold} | {row['warm_wall_s']:.2f} | {row['warm_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
