"""Multi-turn GRPO rollouts (issue #51) on a CUDA machine: leap-finetune's episodes (`environment:`, rollouts on its
sampler) against TRL's tool-using GRPO (`GRPOTrainer(tools=[...])`, its transformers generation) in the same run, on
the same model, tools and prompts.

python bench/agents.py [--model 2.5-1.2b|tiny] [--steps 6] [--warmup-steps 150] [--work DIR] [--out FILE]

- The model: LFM2.5-1.2B's architecture with random weights (no download; bench/memory.py's builder) and the
  bundled tokenizer with LFM2.5's template (TRL parses LFM2.5 tool calls with its own response template). Random
  weights never call a tool, so it is first taught the format by leap-finetune's SFT on lookup traces
  (`--warmup-steps`): the question, a call, the tool's answer, the final answer - or, half the time, an answer at once.
- Each step: 8 prompts x 8 generations = 64 episodes, up to 4 assistant turns (TRL: max_tool_calling_iterations 3),
  256 completion tokens per episode (model and tool tokens).
- Rollout tokens/s = the tokens the model generated / the seconds spent generating them (CUDA-synchronised), steps
  after the first two (warm-up, compilation). leap-finetune: episodes/generate_seconds and the completions' model
  tokens from metrics.jsonl; TRL: its `_generate_single_turn` calls, timed (bench/grpo_rollout.py's Timing).
- The time split of leap-finetune's step: generation, tools (wall), and the rest (scoring, the training step).

Each side runs in its own process (fresh CUDA context). Rows go to --out (bench/results/agents.json's fields:
model, engine, episodes, turns, rollout_tok_s, trl_rollout_tok_s, with the split and peak memory).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

PROMPTS, GENERATIONS, TURNS, BUDGET, SKIP = 8, 8, 4, 256, 2
TOOLS = '''
STORE = {"door": "red", "car": "blue", "roof": "green", "gate": "gold"}


def lookup(key: str) -> str:
    """Read a stored value.

    Args:
        key: e.g. "door"
    """
    return STORE[key]
'''
SCHEMA = {
    "name": "lookup",
    "description": "Read a stored value.",
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string", "description": 'e.g. "door"'}},
        "required": ["key"],
    },
}
KEYS = {"door": "red", "car": "blue", "roof": "green", "gate": "gold"}


def write_data(work: Path) -> None:
    rng = random.Random(0)
    rows = []
    for _ in range(512):
        key = rng.choice(list(KEYS))
        user = {"role": "user", "content": f"What color is the {key}?"}
        if rng.random() < 0.5:
            call = f'<|tool_call_start|>[lookup(key="{key}")]<|tool_call_end|>'
            turns = [user, {"role": "assistant", "content": call}, {"role": "tool", "content": KEYS[key]}]
            rows.append({"messages": [*turns, {"role": "assistant", "content": KEYS[key]}], "tools": [SCHEMA]})
        else:
            rows.append(
                {
                    "messages": [user, {"role": "assistant", "content": rng.choice(list(KEYS.values()))}],
                    "tools": [SCHEMA],
                }
            )
    (work / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = [{"prompt": f"What color is the {k}?", "solution": v} for k, v in KEYS.items()] * 64
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    (work / "tools.py").write_text(textwrap.dedent(TOOLS))


def warm_model(model_key: str, work: Path, steps: int) -> Path:
    """The architecture with random weights, taught the tool-call format by leap-finetune's SFT."""
    from leap_finetune.api import run_config

    if model_key == "tiny":  # (a smoke run of this script on a CPU)
        base = "tiny-lfm2.5"
    else:
        from memory import MODELS, build_published

        from leap_finetune.models.tiny import load_tiny_tokenizer

        base = build_published(MODELS[model_key], work / "random")
        load_tiny_tokenizer("tiny-lfm2.5").save_pretrained(base)  # (LFM2.5's template: TRL parses its calls)
    config = {
        "project_name": "agents-warm",
        "model_name": str(base),
        "chat_template": "lfm2.5",
        "dataset": {"path": str(work / "sft.jsonl")},
        "training_config": {
            "max_steps": steps,
            "per_device_train_batch_size": 16,
            "learning_rate": 3e-4,
            "warmup_steps": 10,
            "logging_steps": 25,
            "save_strategy": "no",
            "max_length": 512,
        },
    }
    return Path(run_config(config, outputs_root=work / "outputs")["model_dir"])


def child_leap(model: Path, work: Path, steps: int) -> dict:
    from leap_finetune.api import run_config

    config = {
        "project_name": "agents-leap",
        "model_name": str(model),
        "chat_template": "lfm2.5",
        "training_type": "grpo",
        "dataset": {"path": str(work / "prompts.jsonl")},
        "environment": {"tools": str(work / "tools.py"), "max_turns": TURNS},
        "rewards": ["accuracy"],
        "training_config": {
            "extends": "DEFAULT_GRPO",
            "use_vllm": False,
            "max_steps": steps,
            "per_device_train_batch_size": PROMPTS * GENERATIONS,
            "num_generations": GENERATIONS,
            "max_completion_length": BUDGET,
            "learning_rate": 1e-6,
            "logging_steps": 1,
            "save_strategy": "no",
        },
    }
    summary = run_config(config, outputs_root=work / "outputs")
    logs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps_logged = [r for r in logs if "episodes/generate_seconds" in r][SKIP:]
    tokens = sum(r["completions/mean_length"] * PROMPTS * GENERATIONS for r in steps_logged)
    generate = sum(r["episodes/generate_seconds"] for r in steps_logged)
    import torch

    return {
        "rollout_tok_s": tokens / generate if generate else float("nan"),
        "turns": sum(r["episodes/turns"] for r in steps_logged) / max(1, len(steps_logged)),
        "calls": sum(r["episodes/calls"] for r in steps_logged) / max(1, len(steps_logged)),
        "generate_s_per_step": generate / max(1, len(steps_logged)),
        "tools_s_per_step": sum(r["episodes/tools_wall_seconds"] for r in steps_logged) / max(1, len(steps_logged)),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
    }


def child_trl(model: Path, work: Path, steps: int) -> dict:
    import importlib.util

    import torch
    from datasets import load_dataset
    from grpo_rollout import Timing
    from trl import GRPOConfig, GRPOTrainer

    spec = importlib.util.spec_from_file_location("bench_tools", work / "tools.py")
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    dataset = load_dataset("json", data_files=str(work / "prompts.jsonl"), split="train")
    dataset = dataset.map(lambda r: {"prompt": [{"role": "user", "content": r["prompt"]}]})

    def accuracy(completions, solution, **_):
        return [1.0 if solution[i] in str(c) else 0.0 for i, c in enumerate(completions)]

    args = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS,
        max_completion_length=BUDGET,
        max_tool_calling_iterations=TURNS - 1,
        learning_rate=1e-6,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_vllm=False,
        bf16=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    timing = Timing()
    trainer = timing.wrap(GRPOTrainer)(
        model=str(model), reward_funcs=accuracy, args=args, train_dataset=dataset, tools=[tools.lookup]
    )
    trainer.train()
    calls = len(timing.rollouts)
    per_step = calls // steps if steps else calls
    kept = timing.rollouts[SKIP * per_step :] if per_step else timing.rollouts
    seconds, tokens = sum(s for s, _ in kept), sum(t for _, t in kept)
    frequency = [r.get("tools/call_frequency") for r in trainer.state.log_history if "tools/call_frequency" in r]
    return {
        "trl_rollout_tok_s": tokens / seconds if seconds else float("nan"),
        "trl_calls": sum(frequency) / len(frequency) if frequency else None,
        "trl_generate_calls_per_step": per_step,
        "trl_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="2.5-1.2b")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup-steps", type=int, default=150)
    parser.add_argument("--work", default="/tmp/leap-agents-bench")
    parser.add_argument("--out", default="agents-results.json")
    parser.add_argument("--child", choices=["leap", "trl"])
    parser.add_argument("--model-dir")
    args = parser.parse_args()
    work = Path(args.work)
    if args.child:
        run = child_leap if args.child == "leap" else child_trl
        print("RESULT " + json.dumps(run(Path(args.model_dir), work, args.steps)), flush=True)
        return
    work.mkdir(parents=True, exist_ok=True)
    write_data(work)
    model = warm_model(args.model, work, args.warmup_steps)
    name = "tiny-lfm2.5" if args.model == "tiny" else f"{args.model} architecture, random weights"
    row = {"model": f"{name} + {args.warmup_steps} SFT steps on tool traces", "engine": "sampler"}
    row.update(episodes=PROMPTS * GENERATIONS, max_turns=TURNS)
    for side in ("leap", "trl"):
        command = [sys.executable, __file__, "--child", side, "--model-dir", str(model), "--work", str(work)]
        log = Path(args.out).with_name(f"agents-{side}.log")  # kept beside --out: a child cut off still tells
        with log.open("w") as sink:
            subprocess.run([*command, "--steps", str(args.steps)], stdout=sink, stderr=subprocess.STDOUT)
        text = log.read_text()
        found = [line[7:] for line in text.splitlines() if line.startswith("RESULT ")]
        row.update(json.loads(found[-1]) if found else {f"{side}_error": text[-2000:]})
    if "rollout_tok_s" in row and "trl_rollout_tok_s" in row:
        row["speedup"] = row["rollout_tok_s"] / row["trl_rollout_tok_s"]
    Path(args.out).write_text(json.dumps([row], indent=1))
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
