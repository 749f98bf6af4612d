"""The vision encoder over real patches only (models/packed_vision.py) against transformers' own (every picture padded
to the processor's 1,024 patches), on a GPU: the same seeded random weights of the LFM2-VL architectures, the image
sizes of bench/vl_sft_throughput.py, bf16 autocast. Prints, per model and batch: the largest logit difference, the
encoder's forward + backward time (median of 10 after 3 warm-ups) and the peak memory of each.

    python bench/vl_packed_check.py --models 450m,1.6b
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "src"))

import vl_sft_throughput  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: --models tiny, a smoke check of the script)

BATCHES = {  # name: the image sizes of one batch (one picture each; larger ones become tiles)
    "small": [(256, 256)] * 8,
    "mixed": [(256, 256), (512, 384), (256, 256), (768, 768), (512, 384), (256, 256), (1024, 768), (256, 256)],
}


def timed(model, inputs) -> tuple[float, float]:
    """(median seconds of the encoder's forward + backward, its peak GiB)."""
    tower = model.model.vision_tower
    times = []
    cuda = DEVICE == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(13):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = tower(
                pixel_values=inputs["pixel_values"],
                pixel_attention_mask=inputs["pixel_attention_mask"],
                spatial_shapes=inputs["spatial_shapes"],
            ).last_hidden_state
        out.float().square().mean().backward()
        if cuda:
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0


def check(key: str, work: Path) -> list[dict]:
    from PIL import Image
    from transformers import AutoProcessor

    from leap_finetune.models.loading import _load_model, load_model
    from leap_finetune.models.tiny import load_tiny_tokenizer

    folder = work / key
    if not (folder / "config.json").exists():
        vl_sft_throughput.build_model(key, folder)
    processor = AutoProcessor.from_pretrained(folder)
    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    rows = []
    for name, sizes in BATCHES.items():
        images = [[Image.new("RGB", size, (i * 30 % 255, 90, 200))] for i, size in enumerate(sizes)]
        inputs = processor(text=["<image>Describe it."] * len(sizes), images=images, return_tensors="pt", padding=True)
        inputs = {k: v.to(DEVICE) for k, v in inputs.items()}
        row = {"model": key, "batch": name, "pictures": int(inputs["pixel_values"].shape[0])}
        row["real_patch_share"] = round(float(inputs["pixel_attention_mask"].float().mean()), 3)
        logits = {}
        for side, loader in (("transformers", _load_model), ("leap", load_model)):
            model = loader(str(folder), tokenizer, {}, dtype=torch.float32).to(DEVICE)
            with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
                logits[side] = model(**inputs).logits.float()
            row[f"{side}_s"], row[f"{side}_peak_gib"] = (round(x, 4) for x in timed(model, inputs))
            del model
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        row["max_logit_diff"] = round(float((logits["leap"] - logits["transformers"]).abs().max()), 4)
        row["logit_scale"] = round(float(logits["transformers"].abs().max()), 2)
        row["speedup"] = round(row["transformers_s"] / row["leap_s"], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="450m,1.6b")
    parser.add_argument("--work", default="/tmp/leap-vl-packed")
    parser.add_argument("--out", default="vl-packed.json")
    args = parser.parse_args()
    rows = [row for key in args.models.split(",") for row in check(key, Path(args.work))]
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print("model | batch | real patches | transformers s | leap s | speed-up | peaks GiB | max logit diff")
    for r in rows:
        print(
            f"{r['model']} | {r['batch']} | {r['real_patch_share']:.0%} | {r['transformers_s']} | {r['leap_s']} | "
            f"{r['speedup']}x | {r['transformers_peak_gib']:.1f} / {r['leap_peak_gib']:.1f} | "
            f"{r['max_logit_diff']} (of {r['logit_scale']})"
        )


if __name__ == "__main__":
    main()
