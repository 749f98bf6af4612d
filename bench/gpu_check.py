"""GPU correctness check for the foundation (run on a CUDA machine; no downloads).

1. Packed logits == each sequence alone, for the LFM2-350M architecture (random init), fp32 and bf16,
   with leap-finetune's boundary-aware convolution (no causal_conv1d installed).
2. One packed training step's loss and gradients == the padded step's.
3. The quickstart through the real CLI on the GPU (bf16 chosen automatically).
Prints a table; `--out FILE` appends it to a results file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import Lfm2Config, Lfm2ForCausalLM
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from leap_finetune.models.packed_conv import enable_exact_packing
from leap_finetune.models.varlen_attention import use_varlen_attention

LFM2_350M = dict(
    vocab_size=65536,
    hidden_size=1024,
    intermediate_size=6656,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=128000,
    layer_types=[
        "conv",
        "conv",
        "full_attention",
        "conv",
        "conv",
        "full_attention",
        "conv",
        "conv",
        "full_attention",
        "conv",
        "full_attention",
        "conv",
        "full_attention",
        "conv",
        "full_attention",
        "conv",
    ],
    conv_L_cache=3,
    block_auto_adjust_ff_dim=True,
    block_ffn_dim_multiplier=1.0,
    block_multiple_of=256,
    tie_word_embeddings=True,
)


def _model(dtype, varlen: bool):
    torch.manual_seed(0)
    model = Lfm2ForCausalLM(Lfm2Config(**LFM2_350M)).to("cuda", dtype)
    model.config.use_cache = False
    if varlen:
        use_varlen_attention(model)
    return model


def _cuda(batch):
    return {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in batch.items()}


def packing_check(dtype, varlen: bool, autocast: bool) -> tuple[float, float, float, float]:
    model = _model(dtype, varlen)
    generator = torch.Generator().manual_seed(1)
    seqs = [torch.randint(10, 60000, (n,), generator=generator).tolist() for n in (301, 77, 512, 5, 1100)]
    batch = _cuda(DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": s} for s in seqs]))
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0].float()
        alone = torch.cat([model(input_ids=torch.tensor([s], device="cuda")).logits[0].float() for s in seqs])
        # the noise floor: the same rows right-padded into one ordinary batch
        padded = DataCollatorForLanguageModeling(pad_token_id=0)([{"input_ids": s} for s in seqs])
        padded_logits = model(
            input_ids=padded["input_ids"].cuda(), attention_mask=padded["attention_mask"].cuda()
        ).logits.float()
        padded_flat = torch.cat([padded_logits[i, : len(s)] for i, s in enumerate(seqs)])
    logit_diff = (packed - alone).abs().max().item()
    floor = (padded_flat - alone).abs().max().item()
    # one training step: packed vs padded loss and gradients
    examples = [{"input_ids": s, "labels": [-100] * (len(s) // 3) + s[len(s) // 3 :]} for s in seqs]
    model.train()
    results = []
    for padding_free in (False, True):
        model.zero_grad()
        b = _cuda(DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples))
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            loss = model(**b).loss
        loss.backward()
        grad = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        results.append((loss.item(), grad))
    loss_diff = abs(results[0][0] - results[1][0])
    grad_rel = ((results[0][1] - results[1][1]).norm() / results[0][1].norm()).item()
    del model
    torch.cuda.empty_cache()
    return logit_diff, floor, loss_diff, grad_rel


def steps_check(steps: int = 8) -> list[tuple[float, float]]:
    """The default precision (float32 weights, bf16 autocast), AdamW: the first `steps` losses of the
    plain path (padded batches, SDPA) and of the fast path (padding-free, varlen attention) on the same
    batches, each from the same initial weights."""
    generator = torch.Generator().manual_seed(2)
    batches = [
        [
            torch.randint(10, 60000, (int(n),), generator=generator).tolist()
            for n in torch.randint(200, 2048, (8,), generator=generator)
        ]
        for _ in range(steps)
    ]
    curves = []
    for padding_free in (False, True):
        model = _model(torch.float32, varlen=padding_free).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        losses = []
        for batch in batches:
            examples = [{"input_ids": s, "labels": [-100] * (len(s) // 3) + s[len(s) // 3 :]} for s in batch]
            b = _cuda(DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples))
            with torch.autocast("cuda", torch.bfloat16):
                loss = model(**b).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves.append(losses)
        del model, optimizer
        torch.cuda.empty_cache()
    return list(zip(*curves))


def quickstart(workdir: Path, packing: bool) -> dict:
    import yaml

    config = yaml.safe_load(Path("examples/quickstart.yaml").read_text())
    config["dataset"]["path"] = str(Path("examples/data/quickstart.jsonl").resolve())
    for bench in config.get("evals", {}).get("benchmarks", []):
        bench["path"] = str((Path("examples") / bench["path"]).resolve())
    config["project_name"] = f"quickstart-packing-{packing}"
    config["training_config"]["packing"] = packing
    path = workdir / f"{config['project_name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "leap_finetune.cli", str(path)], cwd=workdir, capture_output=True, text=True
    )
    elapsed = time.time() - start
    if proc.returncode != 0:
        print(proc.stderr[-4000:])
        return {"rc": proc.returncode}
    [run] = list((workdir / "outputs" / config["project_name"]).iterdir())
    summary = json.loads((run / "summary.json").read_text())
    after = proc.stderr.split("after training")[1].replace("\n", " ")
    answers = re.findall(r"model: '([^']*)'\s+expected:\s+'([^']*)'", after)
    return {
        "rc": 0,
        "seconds": elapsed,
        "eval_before": summary["initial_eval_loss"],
        "eval_after": summary["eval_loss"],
        "steps": summary["global_step"],
        "answers_ok": sum(" ".join(a.split()) == " ".join(b.split()) for a, b in answers),
        "answers": len(answers),
        "device_line": next((l for l in proc.stderr.splitlines() if l.startswith("device:")), ""),
    }


def preference(workdir: Path, name: str, peft: bool) -> dict:
    """A tiny preference example through the CLI on the GPU: its held-out numbers at the end."""
    import yaml

    config = yaml.safe_load(Path(f"examples/{name}").read_text())
    config["dataset"]["path"] = str((Path("examples") / config["dataset"]["path"]).resolve())
    config["project_name"] = f"{config['project_name']}-{'lora' if peft else 'full'}"
    if peft:
        config["peft_config"] = {"extends": "DEFAULT_LORA"}
        config["training_config"].update(learning_rate=1e-2, max_steps=40)
    path = workdir / f"{config['project_name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "leap_finetune.cli", str(path)], cwd=workdir, capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return {"rc": proc.returncode}
    [run] = list((workdir / "outputs" / config["project_name"]).iterdir())
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line]
    return {"rc": 0, "first": evals[0], "last": evals[-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--workdir", default="/tmp/leap-gpu-check")
    parser.add_argument("--packing-only", action="store_true", help="only the packing and loss-match checks")
    args = parser.parse_args()
    print("packed-conv implementation:", enable_exact_packing())
    rows = []
    for label, dtype, varlen, autocast in (
        ("fp32, SDPA over position ids", torch.float32, False, False),
        ("bf16, SDPA over position ids", torch.bfloat16, False, False),
        ("bf16, varlen attention", torch.bfloat16, True, False),
        ("fp32 weights + bf16 autocast, varlen attention", torch.float32, True, True),
        ("fp32 weights + bf16 autocast, SDPA (noise reference)", torch.float32, False, True),
    ):
        rows.append((f"LFM2-350M arch, {label}", *packing_check(dtype, varlen, autocast)))
    curve = steps_check()
    check_lines = [
        "| packing check | max abs logit diff, packed vs alone | same, padded batch vs alone (noise floor) "
        "| abs loss diff, packed vs padded step | rel grad diff |",
        "| --- | --- | --- | --- | --- |",
        *[f"| {name} | {a:.2e} | {f:.2e} | {b:.2e} | {c:.2e} |" for name, a, f, b, c in rows],
        "",
        "| step (LFM2-350M arch, fp32 weights + bf16 autocast, AdamW 1e-4, 8 rows of 200-2048 tokens) | "
        "loss, padded + SDPA | loss, padding-free + varlen | abs diff |",
        "| --- | --- | --- | --- |",
        *[f"| {i + 1} | {a:.4f} | {b:.4f} | {abs(a - b):.2e} |" for i, (a, b) in enumerate(curve)],
        "",
    ]
    if args.packing_only:
        text = "\n".join(
            [
                f"## {datetime.date.today()} - {torch.cuda.get_device_name(0)} - torch {torch.__version__}, "
                f"transformers {transformers.__version__}",
                "",
                "Command: `python bench/gpu_check.py --packing-only`",
                "",
                *check_lines,
            ]
        )
        print(text)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(text + "\n")
        return
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    runs = {packing: quickstart(workdir, packing) for packing in (False, True)}
    prefs = {
        (name, peft): preference(workdir, name, peft)
        for name in ("dpo_tiny.yaml", "kto_tiny.yaml")
        for peft in (False, True)
    }
    lines = [
        f"## {datetime.date.today()} - {torch.cuda.get_device_name(0)} - torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
        "",
        "Command: `python bench/gpu_check.py`",
        "",
        *check_lines,
        "| quickstart through the CLI | rc | wall s (incl. start-up) | steps | eval loss before -> after | exact sample answers | device line |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[
            f"| packing: {p} | {q['rc']} | {q.get('seconds', 0):.1f} | {q.get('steps')} | "
            f"{q.get('eval_before', float('nan')):.3f} -> {q.get('eval_after', float('nan')):.3f} | "
            f"{q.get('answers_ok')}/{q.get('answers')} | {q.get('device_line')} |"
            for p, q in runs.items()
        ],
        "",
        "| preference example through the CLI | rc | held-out metric at step 0 -> last |",
        "| --- | --- | --- |",
        *[
            f"| {name}, {'LoRA' if peft else 'full'} | {r['rc']} | "
            + (
                f"eval_rewards/accuracies {r['first'].get('eval_rewards/accuracies', float('nan')):.2f} -> "
                f"{r['last'].get('eval_rewards/accuracies', float('nan')):.2f}"
                if name.startswith("dpo") and r["rc"] == 0
                else f"eval rewards chosen - rejected {r['first'].get('eval_rewards/chosen', 0) - r['first'].get('eval_rewards/rejected', 0):.2f} -> "
                f"{r['last'].get('eval_rewards/chosen', 0) - r['last'].get('eval_rewards/rejected', 0):.2f}"
                if r["rc"] == 0
                else "failed"
            )
            + " |"
            for (name, peft), r in prefs.items()
        ],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
