"""vLLM on the lent GPU machine (issue #25), in one command within a time budget: rollout speed of vLLM colocated
against leap-finetune's transformers path, GRPO that learns with vLLM colocated (full and LoRA), a `vllm serve`
judge, and `leap-finetune eval --server` against the same server.

python bench/vllm_runs.py --out DIR [--phases LIST] [--budget-s 560] [--work /tmp/leap-vllm-runs] [--smoke]

Phases, run in the order given (`PHASE@ARCH` keeps one architecture of a phase, `PHASE:VARIANT` one variant):
- rollout: bench/grpo_rollout.py's `leap_default` (transformers' generate, static cache + compiled decoding)
  and `leap_vllm` (use_vllm: true, vllm_mode: colocate), for the 350m then the 1.2b architecture: 8 prompts x
  8 generations x 256 new tokens per step, 6 steps, medians over steps 3-6; start-up = the child process's
  start to its first training step (imports, data, model, and vLLM's engine start; `init` = the trainer's
  construction alone, where the engine starts).
- rollout_extra: `leap_vllm` with vllm_gpu_memory_utilization 0.5 (TRL's default is 0.3), and with
  vllm_enable_sleep_mode (350m).
- grpo_learns: GRPO through run_config, vLLM colocated, full and LoRA (DEFAULT_LORA) on 350m
  (`grpo_learns@1.2b`: full), 15 steps. Reward: the fraction of completion tokens in a set of token ids so
  small that a random-weight model samples about one per completion (ids 256-511 of 65,536 for 256 new tokens;
  no special token, so stopping early earns nothing). Why this set: completions then differ by a token or two
  of the set, so each one sampled sits in a completion with an advantage near +1 (a strong, consistent push on
  its row of the tied LM head), and the hidden states can aim at the set's mean embedding; a large set (half
  the vocabulary) gives each token a ~1/16 share of its completion's advantage and a mean embedding near zero,
  and barely moves in 15 steps. Text-level rewards would see nothing: most of the 65,536 ids are outside the
  bundled tokenizer and decode to nothing. Recorded: the mean reward of the first 3 and of the last 3 steps
  (random weights: ~1/256 = 0.004). Learning rates (--full-lr 2e-4, --lora-lr 2e-3) are high on purpose: on
  tiny-lfm2 (hidden size 128, 8 steps of 64 x 16 tokens) full fine-tuning at 4e-4 barely moved this reward
  (0.059 -> 0.067) and at 4e-3 took it from 0.061 to 0.181 (last step 0.236); LoRA at 1e-2 only 0.065 -> 0.073.
  The push on a logit per unit of learning rate grows with the hidden size (logits are dot products over it),
  so 2e-4 on the 350M (hidden 1024) lies between those two.
  `--reward half` instead: the fraction of completion tokens in a direction-coherent half of the vocabulary (~0.5
  at random weights), which LoRA can move too (the rare set did not move under DEFAULT_LORA in 15 steps);
  `--vllm-memory 0.15` for the 1.2B runs (TRL's 0.3 left too little beside full training).
  Variants `sampler` and `lora_sampler` (and `lora_transformers`, 350m): the same runs with use_vllm: false, the
  rollouts through leap-finetune's decoding loop (rl/sampler.py). Every grpo_learns row also measures, per step,
  the engine's sampling log-probabilities against the trainer's own for the same tokens (bench/grpo_rollout.py's
  logp_gap: mean |difference| - TRL's sampling/sampling_logp_difference/mean - and the KL estimate).
- judge: `vllm serve MODEL --gpu-memory-utilization 0.15` (start-up until /v1/models answers), then a
  3-step GRPO run (use_vllm: false) with rewards.judge.base_url at it: the run's judge requests and failures,
  and how many requests the server answered (HTTP 200 lines in its log). Random weights rarely answer with a
  number, so failures are expected; what counts is that every request reached the server and was answered.
- eval_server: `leap-finetune eval CONFIG --server URL/v1` on a 16-row generation benchmark (same server);
  the server is stopped after the last phase that needs it.
Default: rollout@350m,grpo_learns:full,judge,eval_server,grpo_learns:lora,rollout@1.2b,rollout_extra,
grpo_learns@1.2b - what matters first (each feature once, on 350m), then LoRA, the 1.2B rows and the settings
rows as far as the budget goes.

Each item runs in its own process with its own time limit. An item starts only when its usual time on the
H200 (`est` in ITEMS) fits in what is left of --budget-s, else it is a `skipped` row; one that outlives its
limit is killed and its row says how far it got. Rows go to DIR/rows.jsonl as they come (failures are rows
with the error's first lines), the markdown table to DIR/table.md after every row and to stdout at the end,
the end of every item's log to DIR/logs.txt (three files: what a device call brings back).

Every process started here gets VLLM_HOST_IP=127.0.0.1 (vLLM's rendezvous hangs on the machine's unresolvable
hostname), VLLM_ENABLE_V1_MULTIPROCESSING=0 (readable tracebacks) and NVLink multicast off.

--smoke: the plumbing on a CPU, here: tiny-lfm2, a few new tokens, use_vllm: false paths only (one vLLM item
runs to show that a failure becomes a row; the others are skipped rows), `transformers serve` on CPU instead of
`vllm serve`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STARTED = time.monotonic()  # --budget-s counts from here
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

CHILD_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # NVLink multicast off (ENVIRONMENT.md): it can take the shared host's GPUs out of service
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

DEFAULT_PHASES = (
    "rollout@350m,grpo_learns:full,judge,eval_server,grpo_learns:lora,rollout@1.2b,rollout_extra,grpo_learns@1.2b"
)
PHASES = ("rollout", "rollout_extra", "grpo_learns", "judge", "eval_server")
ROLLOUT_STEPS, LEARN_STEPS, JUDGE_STEPS = 6, 15, 3
SERVER_UTILIZATION = 0.15
SERVER_START = "server start"  # the item that starts the server of judge and eval_server
REWARD_NAME = "rare_set_fraction"
WITHOUT_VLLM = ("lora_transformers", "sampler", "lora_sampler")  # grpo_learns variants with use_vllm: false
REWARD_FIRST_ID = 256  # past the special tokens (pad, bos, eos, im_start/im_end, tool markers: ids 0-13)

# (phase, variant, arch): (usual seconds on the H200 - started only if this much budget is left -, own time limit)
ITEMS = {
    ("rollout", "leap_default", "350m"): (60, 200),
    ("rollout", "leap_vllm", "350m"): (100, 240),
    ("rollout", "leap_default", "1.2b"): (90, 240),
    ("rollout", "leap_vllm", "1.2b"): (120, 300),
    ("rollout_extra", "leap_vllm_mem05", "350m"): (90, 240),
    ("rollout_extra", "leap_vllm_sleep", "350m"): (100, 240),
    ("grpo_learns", "full", "350m"): (110, 300),
    ("grpo_learns", "lora", "350m"): (120, 300),
    # the same LoRA run with transformers' rollouts: tells a LoRA that cannot move this reward from adapter weights
    # that do not reach vLLM's engine
    ("grpo_learns", "lora_transformers", "350m"): (100, 300),
    ("grpo_learns", "full", "1.2b"): (150, 300),
    # use_vllm: false - rollouts through leap-finetune's decoding loop (rl/sampler.py), full and LoRA
    ("grpo_learns", "sampler", "350m"): (80, 300),
    ("grpo_learns", "sampler", "1.2b"): (110, 300),
    ("grpo_learns", "lora_sampler", "1.2b"): (110, 300),
    ("grpo_learns", "lora", "1.2b"): (150, 300),
    ("judge", "server start", "350m"): (60, 300),
    ("judge", "grpo + judge", "350m"): (50, 200),
    ("eval_server", "leap-finetune eval --server", "350m"): (25, 150),
}
BUILD_S = {"350m": 15, "1.2b": 40, "tiny": 2}  # building and saving a random-weight model (CPU)
SMOKE_EST_S = 20  # a CPU item of the smoke run, usually


@dataclass
class Item:
    phase: str
    variant: str
    arch: str  # 350m, 1.2b, or tiny (smoke)
    est_s: float
    cap_s: float
    skip: str | None = None  # why it does not run at all (smoke: needs vLLM / a GPU)

    @property
    def uses_vllm_in_training(self) -> bool:
        return self.variant.startswith("leap_vllm") or (
            self.phase == "grpo_learns" and self.variant not in WITHOUT_VLLM
        )

    @property
    def uses_server(self) -> bool:
        return self.phase in ("judge", "eval_server") and self.variant != SERVER_START


def plan(phases: list[str], smoke: bool) -> list[Item]:
    items: list[Item] = []
    for entry in phases:
        rest, _, which = entry.partition(":")
        phase, _, only = rest.partition("@")
        if phase not in PHASES:
            raise SystemExit(f"--phases: unknown phase {phase!r} (phases: {', '.join(PHASES)})")
        before = len(items)
        for phase_, variant, arch in ITEMS:
            if phase_ != phase or (only and arch != only) or (which and variant != which) or variant == SERVER_START:
                continue
            if phase == "grpo_learns" and arch == "1.2b" and only != "1.2b":
                continue  # the 1.2B fine-tune only when asked for by name (grpo_learns@1.2b)
            est, cap = ITEMS[(phase_, variant, arch)]
            item = Item(phase, variant, arch, est, cap)
            if smoke:
                item.est_s, item.cap_s = SMOKE_EST_S, 300
                if arch != "350m":
                    item.skip = "smoke: the tiny model stands for 350m only"
                elif phase == "rollout_extra":
                    item.skip = "smoke: needs vLLM (GPU)"
                else:
                    item.arch = "tiny"
            items.append(item)
        if len(items) == before:
            known = sorted({f"{p}@{a}:{v}" for p, v, a in ITEMS if p == phase and v != SERVER_START})
            raise SystemExit(f"--phases: {entry!r} has no items (those of {phase}: {', '.join(known)})")
    first = next((n for n, i in enumerate(items) if i.uses_server), None)
    if first is not None:  # one server for the judge and eval_server phases, started before the first of them
        est, cap = ITEMS[("judge", SERVER_START, "350m")]
        items.insert(
            first,
            Item(
                items[first].phase,
                SERVER_START,
                "tiny" if smoke else "350m",
                SMOKE_EST_S if smoke else est,
                120 if smoke else cap,
            ),
        )
    return items


# ---------------------------------------------------------------- rows and the table


def finite(value):
    """JSON without NaN (rows.jsonl stays strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def number(value, fmt: str = ",.0f", unit: str = "") -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:{fmt}}{unit}"


def key_numbers(row: dict, rows: list[dict]) -> str:
    if row["status"] == "skipped":
        return "-"
    phase, variant = row["phase"], row["variant"]
    if phase == "setup":
        return row.get("numbers", "-")
    if phase in ("rollout", "rollout_extra"):
        text = (
            f"{number(row.get('rollout_tokens_per_s'))} tok/s; step {number(row.get('step_s'), '.2f', ' s')}; "
            f"rollout {number(row.get('rollout_s'), '.2f', ' s')}; start-up {number(row.get('startup_s'), '.0f', ' s')} "
            f"(init {number(row.get('init_s'), '.0f', ' s')}); first step {number(row.get('first_step_s'), '.1f', ' s')}; "
            f"peak {number(row.get('peak_gib'), '.1f', ' GiB')} (GPU {number(row.get('gpu_used_gib'), '.0f', ' GiB')})"
        )
        base = next(
            (
                r
                for r in rows
                if r["phase"] == "rollout"
                and r["variant"] == "leap_default"
                and r["arch"] == row["arch"]
                and r.get("rollout_tokens_per_s")
            ),
            None,
        )
        if variant != "leap_default" and base and row.get("rollout_tokens_per_s"):
            text += f"; {row['rollout_tokens_per_s'] / base['rollout_tokens_per_s']:.2f}x leap_default's tok/s"
        return text
    if phase == "grpo_learns":
        n = len(row.get("rewards") or [])
        return (
            f"reward {number(row.get('reward_first3'), '.3f')} -> {number(row.get('reward_last3'), '.3f')} "
            f"(steps 1-{min(n, 3)} vs {max(n - 2, 1)}-{n}); step {number(row.get('step_s'), '.2f', ' s')}; "
            f"rollout {number(row.get('rollout_tokens_per_s'))} tok/s; start-up {number(row.get('startup_s'), '.0f', ' s')}; "
            f"completion length {number(row.get('completion_length_first'), '.0f')} -> "
            f"{number(row.get('completion_length_last'), '.0f')}"
            + (
                f"; sampling vs trainer log-probs: mean |diff| {row['logp_gap']['mean_abs']:.1e}, KL estimate "
                f"{row['logp_gap']['kl']:.1e}, max |diff| {row['logp_gap']['max_abs']:.1e}"
                if row.get("logp_gap")
                else ""
            )
        )
    if variant == SERVER_START:
        return f"start-up {number(row.get('startup_s'), '.1f', ' s')} (until /v1/models answered)"
    if phase == "judge":
        return (
            f"{number(row.get('judge_requests'))} judge requests, {number(row.get('judge_failures'))} failures; "
            f"server answered {number(row.get('server_answered'))} of {number(row.get('server_requests'))} "
            f"(HTTP 200 in its log); step {number(row.get('step_s'), '.2f', ' s')}"
        )
    if phase == "eval_server":
        return (
            f"{number(row.get('rows'))} rows, score {number(row.get('score'), '.3f')}, "
            f"{number(row.get('seconds'), '.1f', ' s')} generating; {number(row.get('predictions'))} predictions "
            f"({number(row.get('nonempty_predictions'))} not empty); {number(row.get('server_requests'))} chat "
            f"requests at the server"
        )
    return "-"


def notes(row: dict) -> str:
    parts = []
    if row["status"] == "skipped":
        parts.append(f"skipped: {row.get('reason')}")
    elif row["status"] == "failed":
        parts.append(f"failed: {row.get('error')}")
    elif row["status"] == "timed_out":
        parts.append(f"timed out at its {row.get('limit_s', 0):.0f} s limit after {row.get('steps_done') or 0} steps")
    if row.get("wall_s") is not None and row["phase"] != "setup":
        parts.append(f"wall {row['wall_s']:.0f} s")
    for key in ("note", "last_failure"):
        if row.get(key):
            parts.append(f"{key.replace('_', ' ')}: {row[key]}")
    return "; ".join(parts).replace("|", "/").replace("\n", " ")


class Report:
    def __init__(self, out: Path, header: list[str]):
        self.out, self.header, self.rows = out, header, []
        out.mkdir(parents=True, exist_ok=True)
        (out / "rows.jsonl").write_text("")
        (out / "logs.txt").write_text("")

    def add(self, row: dict) -> None:
        row = finite({"time": datetime.datetime.now().isoformat(timespec="seconds"), **row})
        self.rows.append(row)
        with (self.out / "rows.jsonl").open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(
            f"[{row['phase']} / {row['variant']} / {row['arch']}] {row['status']}: {key_numbers(row, self.rows)}"
            f" | {notes(row)}",
            flush=True,
        )
        (self.out / "table.md").write_text(self.table())

    def log(self, title: str, path: Path, lines: int = 40) -> None:
        try:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = ["(no log)"]
        with (self.out / "logs.txt").open("a") as handle:
            handle.write(f"===== {title} ({path}) =====\n" + "\n".join(tail) + "\n")

    def table(self) -> str:
        lines = [*self.header, "| phase | variant | arch | key numbers | notes |", "| --- | --- | --- | --- | --- |"]
        for row in self.rows:
            lines.append(
                f"| {row['phase']} | {row['variant']} | {row['arch']} | {key_numbers(row, self.rows)} | {notes(row)} |"
            )
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- child processes


def child_env() -> dict:
    env = {**os.environ, **CHILD_ENV, "BENCH_LAUNCHED_AT": repr(time.time())}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT / "src") not in paths:
        paths.append(str(ROOT / "src"))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def stop_group(process: subprocess.Popen, grace_s: float = 10) -> None:
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(command: list[str], log: Path, limit_s: float) -> tuple[str, float, int | None]:
    """Runs `command` in its own process group (killed with it at the limit; it dies with this script);
    returns (status ok / failed / timed_out, wall seconds, exit code)."""
    from leap_finetune.runs.processes import _die_with_parent

    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as handle:
        handle.write(f"$ {shlex.join(command)}\n")
        handle.flush()
        process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            cwd=ROOT,
            preexec_fn=_die_with_parent,
        )
        try:
            code = process.wait(timeout=max(limit_s, 1))
            status = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            stop_group(process)
            code, status = None, "timed_out"
        except BaseException:  # this script is stopping (SIGTERM, Ctrl-C): its child with it
            stop_group(process, grace_s=5)
            raise
    return status, time.perf_counter() - start, code


def result_of(log: Path) -> dict | None:
    found = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("RESULT ")]
    return json.loads(found[-1][7:]) if found else None


def last_lines(log: Path, count: int = 4) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    chosen = errors[-count:] if errors else lines[-count:]
    return " / ".join(chosen)[-500:]


def outcome(
    status: str, wall: float, code: int | None, log: Path, limit_s: float, progress: Path | None = None
) -> dict:
    """The row fields of a child's end: its RESULT, or its progress so far, or the end of its log."""
    result = result_of(log) or {}
    row = {"wall_s": wall, "limit_s": limit_s}
    if status == "timed_out":
        if progress is not None and progress.exists():
            result = {**json.loads(progress.read_text()), **result}
        rewards = result.get("rewards")
        if rewards and "reward_first3" not in result:
            result.update(reward_first3=statistics.mean(rewards[:3]), reward_last3=statistics.mean(rewards[-3:]))
        return {**row, **result, "status": "timed_out"}
    if "error" in result:
        return {**row, **result, "status": "failed"}
    if status != "ok" or not result:
        return {**row, **result, "status": "failed", "error": f"exit code {code}: {last_lines(log)}"}
    return {**row, **result, "status": "ok"}


# ---------------------------------------------------------------- the work


class Runs:
    def __init__(self, args, report: Report):
        self.args, self.report, self.smoke = args, report, args.smoke
        self.work = Path(args.work)
        self.deadline = STARTED + args.budget_s
        self.server = None  # leap_finetune.runs.processes.Server
        self.server_failed: str | None = None
        self.vllm_stuck: str | None = None  # a colocated vLLM that never reached its first step: the others would too
        self.port = free_port()

    # --- budget
    def left(self) -> float:
        reserve = 25 if self.server is not None else 5  # stopping the server, writing the table
        return self.deadline - time.monotonic() - reserve

    # --- inputs
    def model(self, arch: str) -> Path:
        folder = self.work / f"lfm2-{arch}"
        if (folder / "config.json").exists():
            return folder
        start = time.perf_counter()
        if arch == "tiny":
            from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

            tokenizer = load_tiny_tokenizer("tiny-lfm2")
            model = build_tiny_model("tiny-lfm2", tokenizer)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            n_params = sum(p.numel() for p in model.parameters())
        else:
            from sft_throughput import build_model

            n_params, _ = build_model(arch, folder)
        self.report.add(
            {
                "phase": "setup",
                "variant": f"build lfm2-{arch}",
                "arch": arch,
                "status": "ok",
                "wall_s": time.perf_counter() - start,
                "n_params": n_params,
                "numbers": f"{n_params / 1e6:.0f}M parameters, built and saved in {time.perf_counter() - start:.0f} s",
            }
        )
        return folder

    def reward_file(self, arch: str, new_tokens: int) -> Path:
        """The grpo_learns reward for this model's vocabulary (written as a file: custom rewards are files)."""
        if self.args.reward == "half":
            return self.half_reward_file(arch)
        vocab = json.loads((self.model(arch) / "config.json").read_text())["vocab_size"]
        size = max(vocab // new_tokens, 8)  # about one id of the set per completion at random weights
        first = min(REWARD_FIRST_ID, vocab - size)
        path = self.work / f"reward_{arch.replace('.', '_')}.py"
        path.write_text(f'''"""bench/vllm_runs.py grpo_learns' reward: the fraction of completion tokens whose id is in
[{first}, {first + size}): {size} of {vocab} ids, about one per completion of {new_tokens} tokens at random weights.
Token ids, not text: a random-weight model samples mostly ids outside the bundled tokenizer (they decode to
nothing)."""

FIRST, END = {first}, {first + size}


def {REWARD_NAME}(completions, completion_ids=None, **kwargs):
    if completion_ids is None:  # (not passed: nothing to count)
        return [0.0 for _ in completions]
    return [sum(1 for t in ids if FIRST <= t < END) / len(ids) if len(ids) else 0.0 for ids in completion_ids]
''')
        return path

    def half_reward_file(self, arch: str) -> Path:
        """--reward half: the fraction of completion tokens whose (tied) embedding row points along one fixed random
        direction u - half the vocabulary, so ~0.5 at random weights. Unlike the rare set, every token of a completion
        carries signal and the set's tokens share a direction the last hidden state can turn towards: reachable by
        LoRA, which cannot move the embedding rows themselves (tiny-lfm2 on the CPU, 15 steps of 64 x 32 tokens:
        LoRA lr 1e-2 0.48 -> 0.60, full lr 1e-3 0.50 -> 0.70)."""
        import torch
        from safetensors import safe_open

        folder = self.model(arch)
        path = self.work / f"reward_half_{arch.replace('.', '_')}.py"
        ids_path = self.work / f"reward_half_{arch.replace('.', '_')}.json"
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            name = next(k for k in handle.keys() if k.endswith("embed_tokens.weight"))
            embedding = handle.get_tensor(name).float()
        u = torch.randn(embedding.shape[1], generator=torch.Generator().manual_seed(0))
        ids_path.write_text(json.dumps((embedding @ u > 0).nonzero().flatten().tolist()))
        path.write_text(f'''"""bench/vllm_runs.py --reward half: the fraction of completion tokens in a direction-coherent half of
the vocabulary ({ids_path.name})."""
import json

IDS = frozenset(json.loads(open({str(ids_path)!r}).read()))


def {REWARD_NAME}(completions, completion_ids=None, **kwargs):
    if completion_ids is None:
        return [0.0 for _ in completions]
    return [sum(1 for t in ids if t in IDS) / len(ids) if len(ids) else 0.0 for ids in completion_ids]
''')
        return path

    def prompts(self) -> Path:
        path = self.work / "prompts.jsonl"
        if not path.exists():
            from grpo_rollout import PROMPTS_PER_STEP, make_prompts

            make_prompts(path, PROMPTS_PER_STEP * (LEARN_STEPS + 5) * 2)
        return path

    # --- items
    def run(self, item: Item) -> None:
        head = {"phase": item.phase, "variant": item.variant, "arch": item.arch}
        if item.skip:
            self.report.add({**head, "status": "skipped", "reason": item.skip})
            return
        build = 0 if (self.work / f"lfm2-{item.arch}" / "config.json").exists() else BUILD_S[item.arch]
        if self.left() < item.est_s + build:
            self.report.add(
                {
                    **head,
                    "status": "skipped",
                    "reason": f"budget: {max(self.left(), 0):.0f} s left, usually needs {item.est_s + build:.0f} s",
                }
            )
            return
        if item.uses_vllm_in_training and self.vllm_stuck and not self.smoke:
            self.report.add({**head, "status": "skipped", "reason": self.vllm_stuck})
            return
        if item.uses_server and self.server is None:
            self.report.add(
                {**head, "status": "skipped", "reason": f"no server ({self.server_failed or 'not started'})"}
            )
            return
        try:
            self.model(item.arch)
            self.prompts()
            limit = max(min(item.cap_s, self.left(), self.args.item_limit_s or math.inf), 1)
            if item.variant == SERVER_START:
                row = self.start_server(item, limit)
            elif item.phase in ("rollout", "rollout_extra"):
                row = self.rollout(item, limit)
            elif item.phase == "grpo_learns":
                row = self.grpo_learns(item, limit)
            elif item.phase == "judge":
                row = self.judge(item, limit)
            else:
                row = self.eval_server(item, limit)
        except Exception as err:  # noqa: BLE001 - a failure of this script's own part is a row too
            from grpo_rollout import error_text

            row = {"status": "failed", "error": error_text(err)}
        if item.uses_vllm_in_training and row["status"] == "timed_out" and not row.get("steps_done"):
            self.vllm_stuck = (
                f"{item.phase}/{item.variant}/{item.arch} ran {row.get('wall_s', 0):.0f} s without "
                "reaching its first step (vLLM's start hung?); not trying vLLM in training again"
            )
        self.report.add({**head, **row})

    def log_path(self, item: Item) -> Path:
        name = f"{item.phase}-{item.variant}-{item.arch}".replace(" ", "_").replace("/", "_")
        return self.work / "logs" / f"{name}.log"

    def rollout(self, item: Item, limit: float) -> dict:
        log, progress = self.log_path(item), self.log_path(item).with_suffix(".progress.json")
        progress.unlink(missing_ok=True)
        command = [
            sys.executable,
            str(ROOT / "bench" / "grpo_rollout.py"),
            "--child",
            item.variant,
            "--work",
            str(self.work),
            "--progress",
            str(progress),
        ]
        command += ["--smoke", "--steps", "3"] if self.smoke else ["--arch", item.arch, "--steps", str(ROLLOUT_STEPS)]
        return self.finished(item, run_child(command, log, limit), log, limit, progress)

    def finished(self, item: Item, ran: tuple, log: Path, limit: float, progress: Path) -> dict:
        row = outcome(*ran, log, limit, progress)
        self.report.log(
            f"{item.phase} {item.variant} {item.arch}: {row['status']}", log, lines=25 if row["status"] == "ok" else 80
        )
        return row

    def grpo_child(self, item: Item, limit: float, spec: dict) -> dict:
        log, progress = self.log_path(item), self.log_path(item).with_suffix(".progress.json")
        progress.unlink(missing_ok=True)
        spec = {
            "model_dir": str(self.model(item.arch)),
            "data": str(self.prompts()),
            "work": str(self.work),
            "progress": str(progress),
            "project": f"vllm-{item.phase}-{item.variant}-{item.arch}".replace(" ", "-")
            .replace("+", "")
            .replace("--", "-"),
            **spec,
        }
        command = [sys.executable, str(Path(__file__).resolve()), "--child", item.phase, "--spec", json.dumps(spec)]
        return self.finished(item, run_child(command, log, limit), log, limit, progress)

    def grpo_learns(self, item: Item, limit: float) -> dict:
        lora = item.variant.startswith("lora")
        new_tokens = 8 if self.smoke else 256
        return self.grpo_child(
            item,
            limit,
            {
                "steps": 3 if self.smoke else LEARN_STEPS,
                "new_tokens": new_tokens,
                "batch": 16 if self.smoke else 64,
                "use_vllm": not self.smoke and item.variant not in WITHOUT_VLLM,
                "lora": lora,
                "logp_gap": True,
                "learning_rate": self.args.lora_lr if lora else self.args.full_lr,
                "vllm_gpu_memory_utilization": self.args.vllm_memory,
                "reward_file": str(self.reward_file(item.arch, new_tokens)),
            },
        )

    def judge(self, item: Item, limit: float) -> dict:
        before = self.server_requests()
        row = self.grpo_child(
            item,
            limit,
            {
                "steps": 2 if self.smoke else JUDGE_STEPS,
                "batch": 8 if self.smoke else 16,
                "new_tokens": 8 if self.smoke else 32,
                "base_url": self.server.url + "/v1",
                "judge_model": str(self.model(item.arch)),
            },
        )
        after = self.server_requests()
        return {**row, "server_requests": after[0] - before[0], "server_answered": after[1] - before[1]}

    def eval_server(self, item: Item, limit: float) -> dict:
        import yaml

        bench = self.work / "sums16.jsonl"
        bench.write_text(
            "".join(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"What is {a} + {b}? Answer with the number only."},
                            {"role": "assistant", "content": str(a + b)},
                        ]
                    }
                )
                + "\n"
                for a, b in zip(range(2, 18), range(7, 23))
            )
        )
        config = self.work / "eval_server.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "model_name": str(self.model(item.arch)),
                    "evals": {
                        "max_new_tokens": 8 if self.smoke else 32,
                        "batch_size": 16,
                        "benchmarks": [{"name": "sums16", "path": str(bench), "metric": "exact_match"}],
                    },
                },
                sort_keys=False,
            )
        )
        results = self.work / "eval-server" / "results.json"
        shutil.rmtree(results.parent, ignore_errors=True)
        before = self.server_requests()
        log = self.log_path(item)
        status, wall, code = run_child(
            [
                sys.executable,
                "-m",
                "leap_finetune.cli",
                "eval",
                str(config),
                "--server",
                self.server.url + "/v1",
                "--server-model",
                str(self.model(item.arch)),
                "--output",
                str(results),
            ],
            log,
            limit,
        )
        after = self.server_requests()
        self.report.log(f"{item.phase} {item.variant} {item.arch}: {status}", log, lines=25 if status == "ok" else 80)
        row = {
            "wall_s": wall,
            "limit_s": limit,
            "server_requests": after[0] - before[0],
            "server_answered": after[1] - before[1],
        }
        if status != "ok" or not results.exists():
            return {
                **row,
                "status": "timed_out" if status == "timed_out" else "failed",
                "error": f"exit code {code}: {last_lines(log)}",
            }
        report = json.loads(results.read_text())
        scores = report["results"]
        predictions = results.with_name("results.predictions") / "sums16.jsonl"
        answers = (
            [json.loads(line)["prediction"] for line in predictions.read_text().splitlines()]
            if predictions.exists()
            else []
        )
        return {
            **row,
            "status": "ok",
            "rows": scores.get("benchmark/sums16/rows"),
            "score": scores.get("benchmark/sums16/score"),
            "seconds": scores.get("benchmark/sums16/seconds"),
            "predictions": len(answers),
            "nonempty_predictions": sum(1 for a in answers if a.strip()),
            "report_server": report.get("server"),
            "report_model": report.get("model"),
            "first_predictions": [a[:40] for a in answers[:3]],
            "note": f"report's server {report.get('server')}, model {report.get('model')}",
        }

    # --- the server shared by judge and eval_server
    def server_command(self, model: Path) -> tuple[list[str], dict]:
        if self.smoke:  # vLLM does not run on a CPU: transformers' own OpenAI-compatible server
            return (
                [
                    sys.executable,
                    "-m",
                    "transformers.cli.transformers",
                    "serve",
                    str(model),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--device",
                    "cpu",
                ],
                {"CUDA_VISIBLE_DEVICES": ""},
            )
        return (
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.cli.main",
                "serve",
                str(model),
                "--gpu-memory-utilization",
                str(SERVER_UTILIZATION),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
            ],
            {},
        )

    def served_model(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.server.url + "/v1/models", timeout=10) as answer:
            return json.loads(answer.read())["data"][0]["id"]

    def start_server(self, item: Item, limit: float) -> dict:
        from leap_finetune.runs.processes import Server, ServerSpec

        model = self.model(item.arch)
        command, env = self.server_command(model)
        spec = ServerSpec(
            name="vllm serve" if not self.smoke else "transformers serve",
            command=command,
            port=self.port,
            health_path="/v1/models",
            env={**CHILD_ENV, **env},
            start_timeout_s=limit,
        )
        server = Server(spec, self.work / "logs" / "server.log")
        start = time.perf_counter()
        try:
            server.start()
            server.wait_healthy()
        except Exception as err:  # noqa: BLE001 - the row says why; the items that need it are skipped
            from grpo_rollout import error_text

            server.stop()
            self.server_failed = error_text(err, lines=1)
            self.report.log("server (failed start)", server.log_path, lines=60)
            return {
                "status": "failed",
                "error": error_text(err, lines=2) + " / " + last_lines(server.log_path),
                "wall_s": time.perf_counter() - start,
            }
        self.server = server
        return {
            "status": "ok",
            "startup_s": time.perf_counter() - start,
            "wall_s": time.perf_counter() - start,
            "note": f"{shlex.join(command[1:4])} ... (served model {self.served_model()})",
        }

    def server_requests(self) -> tuple[int, int]:
        """(chat requests, of which answered with HTTP 200) in the server's access log so far."""
        if self.server is None:
            return 0, 0
        lines = [
            l for l in self.server.log_path.read_text(errors="replace").splitlines() if "POST /v1/chat/completions" in l
        ]
        return len(lines), sum(1 for l in lines if '" 200' in l)

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.report.log("server", self.server.log_path, lines=30)
            self.server = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- the children's side (GRPO runs)


def child_grpo(phase: str, spec: dict) -> dict:
    """One leap-finetune GRPO run through run_config (the CLI's path), timed like bench/grpo_rollout.py."""
    from grpo_rollout import Timing, timed_run_config
    from transformers import TrainerCallback

    from leap_finetune.files import read_metrics

    timing = Timing(spec["progress"])
    timing.extra = {"rewards": []}
    timing.measure_gap = bool(spec.get("logp_gap"))  # the engine's sampling log-probs against the trainer's

    class Rewards(TrainerCallback):  # (so that a run stopped at its limit still shows its rewards)
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                timing.extra["rewards"].append(round(float(logs["reward"]), 4))
                timing.write_progress()

    training = {
        "use_vllm": bool(spec.get("use_vllm")),
        "max_steps": spec["steps"],
        "per_device_train_batch_size": spec["batch"],
        "num_generations": 8,
        "max_completion_length": spec["new_tokens"],
        "logging_steps": 1,
        "save_strategy": "no",
        "learning_rate": spec.get("learning_rate", 1e-6),
    }
    if training["use_vllm"]:
        training["vllm_mode"] = "colocate"
        if spec.get("vllm_gpu_memory_utilization"):
            training["vllm_gpu_memory_utilization"] = spec["vllm_gpu_memory_utilization"]
    if phase == "judge":  # small and quick: no compiled decoding
        training["cache_implementation"] = None
        rewards = {
            "judge": {
                "model": spec["judge_model"],
                "base_url": spec["base_url"],
                "max_tokens": 8,
                "prompt_template": "Rate the answer from {min_score} to {max_score}; reply with the number "
                "only.\nQuestion: {prompt}\nAnswer: {completion}",
                "timeout_s": 60,
                "max_concurrency": 16,
                "max_failed_steps": 0,
            }
        }
    else:
        rewards = {"funcs": [f"{spec['reward_file']}::{REWARD_NAME}"]}
    config = {
        "project_name": spec["project"],
        "model_name": spec["model_dir"],
        "training_type": "grpo",
        "dataset": {"path": spec["data"]},
        "rewards": rewards,
        "training_config": training,
    }
    if spec.get("lora"):
        config["peft_config"] = {"extends": "DEFAULT_LORA"}
    outputs = Path(spec["work"]) / "outputs"
    shutil.rmtree(outputs / spec["project"], ignore_errors=True)  # a fresh run, never a resume
    summary = timed_run_config(config, outputs, timing, callbacks=[Rewards()])
    metrics = read_metrics(Path(summary["run_dir"]) / "metrics.jsonl")
    rewards_logged = [m["reward"] for m in metrics if "reward" in m]
    lengths = [m["completions/mean_length"] for m in metrics if "completions/mean_length" in m]
    result = {
        **timing.summary(),
        "rewards": [round(r, 4) for r in rewards_logged],
        "reward_first3": statistics.mean(rewards_logged[:3]) if rewards_logged else None,
        "reward_last3": statistics.mean(rewards_logged[-3:]) if rewards_logged else None,
        "completion_length_first": lengths[0] if lengths else None,
        "completion_length_last": lengths[-1] if lengths else None,
        "learning_rate": training["learning_rate"],
    }
    judge = summary.get("judge")
    if judge:
        result.update(
            judge_requests=judge.get("requests"),
            judge_failures=judge.get("failures"),
            last_failure=(judge.get("last_failure") or "")[:160] or None,
        )
        means = [m["rewards/judge/mean"] for m in metrics if "rewards/judge/mean" in m]
        result["judge_reward_mean"] = statistics.mean(means) if means else None
    return result


# ---------------------------------------------------------------- main


def versions() -> dict:
    found = {}
    for name in ("torch", "vllm", "transformers", "trl", "peft"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def device_name(smoke: bool) -> str:
    if smoke:
        return "CPU (smoke)"
    try:  # (nvidia-smi, not torch: this process keeps no CUDA context beside the children's)
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown device"


def header(args, found: dict, device: str) -> list[str]:
    if args.smoke:
        what = (
            "Smoke run on a CPU: tiny-lfm2 (random weights); rollout 8 prompts x 8 generations x 8 new tokens, 3 "
            "steps; grpo_learns 3 steps x 16 completions x 8 tokens, use_vllm: false; judge / eval_server against "
            "`transformers serve` on CPU (2 steps x 8 completions)."
        )
    else:
        what = (
            f"Random-weight LFM2 architectures built by bench/sft_throughput.py (bf16 checkpoints, vocabulary 65,536, "
            f"the bundled tokenizer); prompts of 20-150 tokens. rollout: 8 prompts x 8 generations x 256 new tokens "
            f"per step, {ROLLOUT_STEPS} steps, medians over steps 3-{ROLLOUT_STEPS}; start-up = process start to the "
            f"first step, init = the trainer's construction (vLLM's engine starts there). grpo_learns: {LEARN_STEPS} "
            f"steps x 64 completions x 256 tokens, vLLM colocate (variants {', '.join(WITHOUT_VLLM)}: use_vllm false)"
            + (f" (vllm_gpu_memory_utilization {args.vllm_memory:g})" if args.vllm_memory else "")
            + (
                ", reward = fraction of completion tokens in a direction-coherent half of the vocabulary (~0.5 at "
                "random weights)"
                if args.reward == "half"
                else ", reward = fraction of completion tokens with ids 256-511 (~1/256 at random weights)"
            )
            + f", learning rate {args.full_lr:g} (full) / {args.lora_lr:g} (LoRA). "
            f"judge / eval_server: vllm serve --gpu-memory-utilization {SERVER_UTILIZATION} on 127.0.0.1; the judge "
            f"run: {JUDGE_STEPS} steps x 16 completions of 32 tokens, use_vllm: false."
        )
    env = ", ".join(
        f"{k}={CHILD_ENV[k]}"
        for k in (
            "VLLM_HOST_IP",
            "VLLM_ENABLE_V1_MULTIPROCESSING",
            "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS",
        )
    )
    return [
        f"### {datetime.date.today()} - vLLM runs (issue #25) - {device} - torch {found['torch']}, "
        f"vllm {found['vllm']}, transformers {found['transformers']}, trl {found['trl']}, peft {found['peft']}",
        "",
        f"Command: `python {shlex.join(sys.argv)}`",
        "",
        f"{what} Environment of every process: {env}.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="folder for rows.jsonl, table.md, logs.txt (required)")
    parser.add_argument(
        "--phases", default=DEFAULT_PHASES, help=f"comma-separated, in order (default: {DEFAULT_PHASES})"
    )
    parser.add_argument("--budget-s", type=float, default=560, help="wall seconds for everything (default 560)")
    parser.add_argument("--work", default=None, help="models, runs, logs (default /tmp/leap-vllm-runs[-smoke])")
    parser.add_argument("--full-lr", type=float, default=2e-4, help="grpo_learns, full fine-tuning (default 2e-4)")
    parser.add_argument("--lora-lr", type=float, default=2e-3, help="grpo_learns, LoRA (default 2e-3)")
    parser.add_argument("--smoke", action="store_true", help="CPU check of the plumbing (tiny-lfm2, no vLLM)")
    parser.add_argument(
        "--reward",
        default="rare",
        choices=["rare", "half"],
        help="grpo_learns' reward: rare (ids 256-511, ~1/256 at random weights) or half (a "
        "direction-coherent half of the vocabulary, ~0.5 at random weights; LoRA can move it)",
    )
    parser.add_argument(
        "--vllm-memory",
        type=float,
        default=None,
        help="grpo_learns: vllm_gpu_memory_utilization (TRL's default 0.3 leaves too little beside "
        "full training of 1.2B at 64 x 256 tokens)",
    )
    parser.add_argument(
        "--item-limit-s", type=float, default=None, help="at most this long per item (to check the time-limit path)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        try:
            result = child_grpo(args.child, json.loads(args.spec))
        except Exception as err:  # noqa: BLE001 - a run that fails is a row
            from grpo_rollout import error_text

            result = {"error": error_text(err)}
        print("RESULT " + json.dumps(finite(result)), flush=True)
        return
    if not args.out:
        parser.error("--out DIR is required")
    args.work = args.work or ("/tmp/leap-vllm-runs-smoke" if args.smoke else "/tmp/leap-vllm-runs")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    os.environ.update(CHILD_ENV)  # this process's own children (the server too) inherit them
    items = plan([p for p in args.phases.split(",") if p], args.smoke)
    found, device = versions(), device_name(args.smoke)
    report = Report(Path(args.out), header(args, found, device))
    report.add(
        {
            "phase": "setup",
            "variant": "environment",
            "arch": "-",
            "status": "ok",
            "device": device,
            **found,
            "command": shlex.join(sys.argv),
            "budget_s": args.budget_s,
            "env": CHILD_ENV,
            "plan": [f"{i.phase}/{i.variant}/{i.arch}" for i in items],
            "numbers": f"{len(items)} items planned, budget {args.budget_s:.0f} s",
        }
    )
    runs = Runs(args, report)

    def stopped(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    last_server_use = max((n for n, i in enumerate(items) if i.phase in ("judge", "eval_server")), default=-1)
    item = None
    try:
        for n, item in enumerate(items):
            runs.run(item)
            if n == last_server_use:
                runs.stop_server()
        item = None
    except (SystemExit, KeyboardInterrupt) as stop:
        if item is not None:  # the item it was running is a row too
            report.add(
                {
                    "phase": item.phase,
                    "variant": item.variant,
                    "arch": item.arch,
                    "status": "failed",
                    "error": f"this script was stopped ({type(stop).__name__} {getattr(stop, 'code', '')}) "
                    "while the item ran",
                }
            )
        raise
    finally:
        runs.stop_server()
        table = report.table()
        (Path(args.out) / "table.md").write_text(table)
        print("\n" + table, flush=True)


if __name__ == "__main__":
    main()
