"""`export RUN --gguf auto`: the smallest GGUF quant that keeps the run's scores.

The ladder below is exported and verified as any `--gguf` list is (the run's benchmarks on each file, and the KL
of its next-token predictions from the original's: verify.py, drift.py); a quant passes when no benchmark drops by
more than `--max-drop` (absolute score) and its KL stays within `--max-kl`. The smallest file that passes is kept;
the table of every rung is the evidence, printed, in quantization.json and in the card. If none passes, nothing is
kept and the error says so, with what would help (quantization-aware training, a looser bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError
from leap_finetune.gguf_export.verify import Verification

# From the largest file to the smallest (llama.cpp's bits per weight: 8.5, 6.6, 5.7, 4.9, 4.5).
LADDER = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
DEFAULT_MAX_DROP = 0.02  # absolute benchmark score, on every benchmark
# nats per token: q8_0 sits near 1e-3 on LFM2 models, 4-bit quants at 1e-2 to 1e-1 (bench/RESULTS.md)
DEFAULT_MAX_KL = 0.05


@dataclass
class Choice:
    max_drop: float
    max_kl: float
    chosen: str | None = None
    rungs: list[dict] = field(default_factory=list)  # each quant: type, size, worst drop, kl, passes, why not

    def as_json(self) -> dict:
        return {
            "how": f"the smallest file whose every benchmark score drops by at most {self.max_drop} (absolute) and "
            f"whose KL from the original stays within {self.max_kl} nats/token",
            "max_drop": self.max_drop,
            "max_kl": self.max_kl,
            "chosen": self.chosen,
            "ladder": self.rungs,
        }


def check_model(model_id: str) -> None:
    """`auto` scores every file by reading it back with transformers, which cannot read an LFM2-MoE GGUF file."""
    from leap_finetune.models.architectures import supports
    from leap_finetune.models.registry import model_type

    if supports(model_type(model_id), "moe"):
        raise LeapError(
            "--gguf auto scores each file through transformers, which cannot read a mixture-of-experts (LFM2-MoE) "
            "GGUF file back: no quant could be judged",
            where="export",
            fix="name the types (--gguf q8_0,q4_k_m) and score them through llama.cpp: llama-server -m FILE, then "
            "leap-finetune eval --server (docs/moe.md)",
        )


def check_auto(verify: bool, measured: tuple) -> None:
    """Before anything is written: `auto` decides on the run's benchmarks, so it needs them."""
    resolved, why_not = measured
    if not verify:
        raise LeapError(
            "--gguf auto chooses by the run's benchmarks, and --no-verify skips them",
            where="export",
            fix="drop --no-verify, or name the types yourself: --gguf q4_k_m",
        )
    if resolved is None:
        raise LeapError(
            f"--gguf auto chooses by the run's benchmarks, and there are none to run: {why_not}",
            where="export",
            fix="give the run benchmarks (evals.benchmarks in its config; `leap-finetune eval` can score a run "
            "afterwards), or name the types yourself: --gguf q4_k_m",
        )


def check_bounds(max_drop: float, max_kl: float) -> None:
    for name, value in (("--max-drop", max_drop), ("--max-kl", max_kl)):
        if not value >= 0:
            raise LeapError(f"{name} is {value}: expected a number >= 0", where="export", fix=f"e.g. {name} 0.02")


def choose(verification: Verification, files: dict[str, Path], max_drop: float, max_kl: float) -> Choice:
    """Each rung judged against the bounds; the smallest passing one chosen."""
    choice = Choice(max_drop, max_kl)
    for gguf_type, path in files.items():
        rung = {"type": gguf_type, "size_bytes": path.stat().st_size}
        if gguf_type in verification.unread or gguf_type not in verification.scores:
            why = verification.unread.get(gguf_type, "not scored")
            rung.update(passes=False, why_not=f"not measured here ({why})")
        else:
            drops = {name: round(verification.loss(gguf_type, name), 6) for name, _ in verification.benchmarks}
            kl = (verification.drift.get(gguf_type) or {}).get("kl")
            worst = max(drops, key=drops.get)
            why = []
            if drops[worst] > max_drop:
                why.append(f"{worst} drops {drops[worst]:.4f} > {max_drop}")
            if kl is not None and kl > max_kl:
                why.append(f"KL {kl:.2e} > {max_kl}")
            rung.update(drops=drops, kl=kl, passes=not why, why_not="; ".join(why) or None)
            if kl is None:  # (no answer tokens to compare: the scores alone decide, and the table says so)
                rung["note"] = "KL not measured: --max-kl not applied"
        choice.rungs.append(rung)
    passing = [r for r in choice.rungs if r["passes"]]
    if passing:
        choice.chosen = min(passing, key=lambda r: r["size_bytes"])["type"]
    return choice


def print_choice(choice: Choice, console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"--gguf auto: at most {choice.max_drop} lost on any benchmark, KL <= {choice.max_kl}")
    for column in ("quant", "size", "worst drop", "KL", "within the bounds"):
        table.add_column(column, justify="left" if column in ("quant", "within the bounds") else "right")
    for rung in choice.rungs:
        drops = rung.get("drops") or {}
        worst = f"{max(drops.values()):+.4f}" if drops else "-"
        kl = f"{rung['kl']:.2e}" if rung.get("kl") is not None else "-"
        verdict = "yes" + (" (chosen)" if rung["type"] == choice.chosen else "") if rung["passes"] else rung["why_not"]
        verdict += f" ({rung['note']})" if rung.get("note") else ""
        table.add_row(rung["type"], _size(rung["size_bytes"]), worst, kl, verdict)
    console.print(table)


def refuse_none(choice: Choice) -> LeapError:
    return LeapError(
        f"no quant of the ladder ({', '.join(LADDER)}) stays within the bounds (the table above): nothing was kept",
        where="export --gguf auto",
        fix="train for the format with quantization-aware training (qat: {target: q4_0} in the run's config, "
        "docs/export.md), loosen --max-drop / --max-kl, or export a type yourself: --gguf q8_0",
    )


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"
