"""LFM2-VL image SFT throughput (issue #27) on one GPU: leap-finetune's real path against TRL's defaults.

python bench/vl_sft_throughput.py [--models 450m,1.6b] [--steps 30] [--variants ours-full,ours-lora,trl-full,trl-lora]
                                  [--batch 8] [--record] [--smoke]

`--smoke` checks the script on a CPU: models the size of `tiny-lfm2.5-vl`, 3 steps, every variant.

The GPU machine needs torchvision (LFM2-VL's image processor is built on it): the wheel built for the installed
torch (torch 2.14.1 -> torchvision 0.29.1). One GPU: CUDA_VISIBLE_DEVICES=0 unless it is set, since both sides
train in this process (leap-finetune through `run_config(callbacks=...)`, which needs an in-process run).

Models (random weights, no download), each saved as a local folder with its processor (Lfm2VlProcessor around
LFM2-VL's image processor, the bundled `tiny-lfm2.5-vl` tokenizer with LFM2-VL's image tokens, its chat
template), so that `model_name` is a folder as for a user's checkpoint:
- language model: LFM2-350M (450M) / LFM2-1.2B (1.6B): bench/sft_throughput.py ARCHS and `lfm2_config`, with the
  real models' vocabulary of 65,536 (the tokenizer uses the first 620 ids; the LM head and the loss cost what
  they cost in the real models).
- vision encoder: SigLIP2 NaFlex, 16-pixel patches, 256 position embeddings, no pooling head. 450M: base (width
  768, 12 layers, 12 heads, MLP 3072; ~86M). 1.6B: so400m (width 1152, 16 heads, MLP 4304) with 26 layers: the
  checkpoint has 27 and takes its features from the 26th (vision_feature_layer -2); transformers' LFM2-VL uses the
  last layer, so the transformers-format checkpoint keeps 26.
- projector: pixel unshuffle by 2 (2x2 patches -> one token), LayerNorm, Linear -> GELU -> Linear, 2560 wide.
- image processor (processor_config.json): images up to max_image_tokens 256 (x max_pixels_tolerance: 2.0 on
  450M, 1.5 on 1.6B) are resized to 64-256 tokens; larger ones are cut into 512-pixel tiles (2-10 tiles, 256
  tokens each), plus a thumbnail on 1.6B only (use_thumbnail); mean/std 0.5, bilinear (the defaults).
  Sources: LiquidAI/LFM2-VL-450M config.json, processor_config.json and preprocessor_config.json (the original
  upload, copied in github.com/varun00391/local-finetuned-model); LiquidAI/LFM2-VL-450M and LFM2-VL-1.6B
  processor_config.json (their Hugging Face pages); LFM2-VL-1.6B's vision tower (so400m, 27 layers,
  vision_feature_layer -2, projector 2560) from its config as read by third-party loaders (mlx-community's
  LFM2-VL-1.6B checkpoint geometry; llama.cpp's converter drops the layers after vision_feature_layer); the
  original modeling_lfm2_vl.py always applies the projector's LayerNorm. Not checked against the 1.6B
  config.json file itself (the Hub is not reachable from here).

Data: synthetic SFT rows in the spec's format, one image per row (JSONL, image paths relative to the file):
{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/00012.png"}, {"type": "text", ...}]},
{"role": "assistant", "content": "..."}]}. The PNGs (shapes on a plain background) come in four sizes:
256x256 (30% of rows: 64 image tokens), 512x384 (30%: 192), 768x768 (20%: 4 tiles, +thumbnail on 1.6B) and
1024x768 (20%: 6 tiles, +thumbnail). Questions of 8-40 words, answers of 50-400 tokens (log-normal around 150).
The same rows in TRL's format (`messages` with {"type": "image"} placeholders, an `images` column of paths cast
to datasets' Image feature) for the baseline.

Variants (each model):
- ours-full: `training_type: sft`, `training_config: {extends: DEFAULT_VLM_SFT}`; ours-lora: the same plus
  `peft_config: {extends: DEFAULT_VLM_LORA}`; both through `api.run_config` (bench/sft_throughput.py's
  measured_leap_run), the profile's own settings apart from max_steps, the batch size, logging and no saving.
- trl-full / trl-lora: `trl.SFTTrainer(model=folder, processing_class=the processor, train_dataset=messages +
  images)` with TRL's defaults - SFTTrainer chooses DataCollatorForVisionLanguageModeling itself (images
  processed in the collator, batches padded), gradient checkpointing on, float32 weights - and bf16 autocast on
  a GPU, the same batch size, steps, learning rate (2e-5 in both) and max_length (the profile's 4096: TRL's
  default 1024 would cut image tokens and fail); trl-lora with a peft LoraConfig of DEFAULT_VLM_LORA's rank,
  alpha, dropout and target modules (the language model's layers).

Counting, the same for both sides: tokens = every non-padding position of input_ids, which holds each image's
full expansion (its image tokens - the projector's outputs - and the start/end/tile markers) next to the text
tokens of the chat template; counted by the Trainer (`include_num_input_tokens_seen: non_padding`:
attention_mask.sum(), or input_ids != pad for padding-free batches), logged as tokens/s between logging steps by
leap-finetune's MetricsLog (in metrics.jsonl), the median after the warm-up steps (10; 1 with --smoke).
Image pixels and vision patches are not tokens here: they are in the FLOPs.

MFU = tokens/s x FLOPs per token / the bf16 matmul peak measured in the same run (bench/sft_throughput.py;
with --smoke a float32 matmul peak of the CPU, so only the code path is checked). FLOPs per token = the
training FLOPs of the whole dataset / its tokens, model FLOPs only (no recomputation from activation
checkpointing; no work on padding: a tile's patches padded to 1024 are not counted, nor padded text positions):
  forward, per part:
    vision:    2 N_vision x patches + 4 L_vision d_vision x sum over tiles of patches^2 (bidirectional attention
               within each tile, thumbnail or single image: QK^T and AV)
    projector: 2 N_projector x image tokens
    language:  2 N_language x tokens (tied embedding counted once, as the LM head)
               + 4 L_attention d_model x sum over rows of tokens^2 / 2 (causal attention: QK^T and AV)
  backward, per part: the gradients of the activations (= the forward's matmuls, twice its attention) where a
  trained part lies at or before it (vision -> projector -> language), plus the weight gradients of its trained
  parameters (forward matmul FLOPs x trained / all parameters of the part).
  Full fine-tuning trains every part: 3x the forward. LoRA with the vision encoder and projector frozen (TRL's
  LoRA run): vision and projector forward only, the language model ~2x its forward, its attention 3x.
  Which parameters train is read from the model each trainer holds (a callback at train start; N counts the
  parameters the forward uses: peft's frozen original of a module trained in full next to LoRA is left out).
  The "trainable" column and the notes under the table show it; "vs TRL" says when the two sides train
  different parameters (then the speeds compare different work; the MFUs stay comparable).
Peak GiB: torch.cuda.max_memory_allocated over the run (model load included).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import transformers  # noqa: E402
from sft_throughput import lfm2_config, matmul_peak, measured_leap_run, tokens_per_second  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

# The vision encoders: SigLIP2 NaFlex base-patch16 (LFM2-VL-450M) and so400m-patch16 (LFM2-VL-1.6B, 26 of 27 layers).
SIGLIP2 = {
    "model_type": "siglip2_vision_model",
    "patch_size": 16,
    "num_patches": 256,
    "num_channels": 3,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}
# LFM2-VL's image processor (processor_config.json): 512-pixel tiles for large images, 64-256 tokens otherwise.
IMAGE_PROCESSOR = {
    "downsample_factor": 2,
    "encoder_patch_size": 16,
    "do_image_splitting": True,
    "min_tiles": 2,
    "max_tiles": 10,
    "tile_size": 512,
    "min_image_tokens": 64,
    "max_image_tokens": 256,
}
MODELS = {
    # key: (name, language model in ARCHS, vision encoder, projector width, image processor)
    "450m": (
        "LFM2-VL-450M",
        "350m",
        {**SIGLIP2, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
        2560,
        {**IMAGE_PROCESSOR, "use_thumbnail": False, "max_pixels_tolerance": 2.0},
    ),
    "1.6b": (
        "LFM2-VL-1.6B",
        "1.2b",
        {**SIGLIP2, "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 26, "num_attention_heads": 16},
        2560,
        {**IMAGE_PROCESSOR, "use_thumbnail": True, "max_pixels_tolerance": 1.5},
    ),
    "tiny": ("tiny-lfm2.5-vl-sized", None, None, 64, None),  # --smoke: the built-in tiny model's sizes
}
PARTS = ("vision", "projector", "language")
VARIANTS = {
    # name: (label, side, LoRA)
    "ours-full": ("leap-finetune, DEFAULT_VLM_SFT", "ours", False),
    "ours-lora": ("leap-finetune, DEFAULT_VLM_LORA", "ours", True),
    "trl-full": ("TRL SFTTrainer defaults", "trl", False),
    "trl-lora": ("TRL SFTTrainer defaults + LoRA", "trl", True),
}
# rows' image sizes (width, height) and their share of the rows
SIZES = [((256, 256), 0.3), ((512, 384), 0.3), ((768, 768), 0.2), ((1024, 768), 0.2)]
IMAGES_PER_SIZE = 16
WORDS = (
    "a the red blue green small large round square bright dark shape circle box line near far left right top "
    "bottom center corner edge picture image shows there is are with and of on in beside above below color"
).split()


def part_of(name: str) -> str:
    """The part of LFM2-VL a parameter belongs to, from its name (also under a peft or compile wrapper)."""
    if "vision_tower" in name:
        return "vision"
    if "multi_modal_projector" in name:
        return "projector"
    return "language"


def parameter_counts(model) -> dict[str, list[int]]:
    """{part: [trainable, all]} of the parameters the forward uses (a tied embedding counted once; peft's frozen
    `original_module` of a module trained in full next to LoRA - modules_to_save - left out: its copy runs)."""
    counts = {part: [0, 0] for part in PARTS}
    for name, param in model.named_parameters():
        if ".original_module." in name:
            continue
        part = counts[part_of(name)]
        part[1] += param.numel()
        if param.requires_grad:
            part[0] += param.numel()
    return counts


class TrainedParts(TrainerCallback):
    """Records which parameters the trainer's model trains, at train start (the model as wrapped by peft)."""

    def __init__(self):
        self.counts = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.counts = parameter_counts(model)


def cpu_matmul_peak() -> float:
    """--smoke only: a float32 matmul peak of this CPU, so that the MFU column is computed like on a GPU."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    start, iters = time.perf_counter(), 10
    for _ in range(iters):
        a @ b
    return 2 * 1024**3 * iters / (time.perf_counter() - start)


def lora_options() -> dict:
    """DEFAULT_VLM_LORA's LoRA options (rank, alpha, dropout, bias, targets), for TRL's LoraConfig."""
    from leap_finetune.config.profiles import PEFT_PROFILES

    if "DEFAULT_VLM_LORA" in PEFT_PROFILES:
        profile = dict(PEFT_PROFILES["DEFAULT_VLM_LORA"])
    else:  # (before the profile exists) DEFAULT_LORA narrowed to the language model, as issue #27 specifies
        profile = dict(PEFT_PROFILES["DEFAULT_LORA"])
        profile["target_modules"] = r".*language_model.*\.({})".format("|".join(profile["target_modules"]))
    profile.pop("use_peft", None)
    return profile


def vlm_max_length() -> int:
    from leap_finetune.config.profiles import TRAINING_PROFILES

    return TRAINING_PROFILES.get("DEFAULT_VLM_SFT", {}).get("max_length", 4096)


def build_model(key: str, folder: Path) -> dict:
    """Builds LFM2-VL architecture `key` with random weights and saves it with its processor; returns its shape."""
    from transformers import (
        Lfm2Config,
        Lfm2VlConfig,
        Lfm2VlForConditionalGeneration,
        Lfm2VlImageProcessor,
        Lfm2VlProcessor,
    )

    from leap_finetune.models import tiny
    from leap_finetune.models.lfm2_keys import add_original_lfm2_keys

    _, language, vision, projector, image_processor = MODELS[key]
    tokenizer = tiny.load_tiny_tokenizer("tiny-lfm2.5-vl")
    if key == "tiny":
        text = Lfm2Config(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
            **tiny.TINY_ARCH,
        )
        image_processor = dict(tiny.TINY_IMAGE_PROCESSOR)
        patches = image_processor["max_image_tokens"] * image_processor["downsample_factor"] ** 2
        vision = {**tiny.TINY_VISION, "num_patches": patches}
    else:
        text = lfm2_config(language)  # vocabulary 65,536 >= len(tokenizer); pad/bos/eos 0/1/7 as the tokenizer's
        assert (text.pad_token_id, text.bos_token_id, text.eos_token_id) == (
            tokenizer.pad_token_id,
            tokenizer.bos_token_id,
            tokenizer.eos_token_id,
        )
    config = Lfm2VlConfig(
        text_config=text.to_dict(),
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        projector_hidden_size=projector,
        projector_use_layernorm=True,
        downsample_factor=image_processor["downsample_factor"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Lfm2VlForConditionalGeneration(config).to(torch.bfloat16)  # as LiquidAI ships its checkpoints
    add_original_lfm2_keys(model.config)  # vLLM's LFM2 reads them
    model.save_pretrained(folder)
    processor = Lfm2VlProcessor(
        image_processor=Lfm2VlImageProcessor(**image_processor),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(folder)
    text_config, vision_config = model.config.text_config, model.config.vision_config
    shape = {
        "params": {part: n for part, (_, n) in parameter_counts(model).items()},
        "attention_layers": sum(t == "full_attention" for t in text_config.layer_types),
        "d_model": text_config.hidden_size,
        "vision_layers": vision_config.num_hidden_layers,
        "d_vision": vision_config.hidden_size,
    }
    del model
    return shape


def make_images(folder: Path, rng: random.Random) -> dict[tuple[int, int], list[str]]:
    """IMAGES_PER_SIZE PNGs of each size: a few filled shapes on a plain background."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    paths, n = {}, 0
    for size, _ in SIZES:
        paths[size] = []
        for _ in range(IMAGES_PER_SIZE):
            image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
            draw = ImageDraw.Draw(image)
            for _ in range(rng.randint(3, 8)):
                x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
                box = [x0, y0, x0 + rng.randint(16, size[0] // 2), y0 + rng.randint(16, size[1] // 2)]
                fill = tuple(rng.randrange(256) for _ in range(3))
                (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
            name = f"img/{n:05d}.png"
            image.save(folder.parent / name, compress_level=1)
            paths[size].append(name)
            n += 1
    return paths


def make_data(work: Path, rows: int, seed: int = 0) -> list[dict]:
    """Writes work/vl.jsonl (the spec's format), work/vl_trl.jsonl (TRL's) and work/img/; returns the rows as
    {"size", "question", "answer"}."""
    from leap_finetune.models.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    sample = " ".join(WORDS * 10)
    per_word = len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / (len(WORDS) * 10)
    rng = random.Random(seed)
    images = make_images(work / "img", rng)
    sizes, weights = zip(*SIZES)
    described, ours, theirs = [], [], []
    for _ in range(rows):
        size = rng.choices(sizes, weights)[0]
        image = rng.choice(images[size])
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))).capitalize() + "?"
        answer_tokens = int(min(400, max(50, rng.lognormvariate(math.log(150), 0.6))))
        answer = " ".join(rng.choice(WORDS) for _ in range(max(1, int(answer_tokens / per_word)))).capitalize() + "."
        ours.append(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "image": image}, {"type": "text", "text": question}],
                    },
                    {"role": "assistant", "content": answer},
                ]
            }
        )
        theirs.append(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
                    {"role": "assistant", "content": [{"type": "text", "text": answer}]},
                ],
                "images": [str((work / image).resolve())],
            }
        )
        described.append({"size": size, "question": question, "answer": answer})
    (work / "vl.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ours))
    (work / "vl_trl.jsonl").write_text("".join(json.dumps(row) + "\n" for row in theirs))
    return described


def workload(model_dir: Path, rows: list[dict]) -> dict:
    """The dataset as this model's processor turns it into tokens and patches (summed over the rows): tokens,
    sum of tokens^2, image tokens, vision patches, sum of patches^2 per tile, and the row lengths."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    expansion = {}  # image size -> (tokens replacing its <image>, image tokens, patches of each tile)
    for size, _ in SIZES:
        out = processor(text="<image>", images=[Image.new("RGB", size)])
        ids = list(out["input_ids"][0])
        patches = [int(h) * int(w) for h, w in out["spatial_shapes"].tolist()]
        expansion[size] = (len(ids), ids.count(processor.image_token_id), patches)
    seconds = 0.0  # the image processor's time per row in one process, for reading the results
    for size, share in SIZES:
        image = Image.new("RGB", size)
        processor.image_processor(images=[image])
        start = time.perf_counter()
        for _ in range(3):
            processor.image_processor(images=[image])
        seconds += share * (time.perf_counter() - start) / 3
    total = {"tokens": 0, "tokens_sq": 0, "image_tokens": 0, "patches": 0, "patches_sq": 0, "lengths": []}
    total["image_seconds"] = seconds
    checked = set()
    for row in rows:
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row["question"]}]},
            {"role": "assistant", "content": [{"type": "text", "text": row["answer"]}]},
        ]
        text = processor.apply_chat_template(messages, tokenize=False)
        n_text = len(processor.tokenizer(text, add_special_tokens=False)["input_ids"]) - 1  # less the <image>
        n_expanded, n_image, patches = expansion[row["size"]]
        length = n_text + n_expanded
        if row["size"] not in checked:  # once per size: the processor's own count of the whole row agrees
            messages[0]["content"][0]["image"] = Image.new("RGB", row["size"])
            full = processor.apply_chat_template(messages, tokenize=True, return_dict=True)
            assert len(full["input_ids"][0]) == length, (row["size"], len(full["input_ids"][0]), length)
            checked.add(row["size"])
        total["tokens"] += length
        total["tokens_sq"] += length * length
        total["image_tokens"] += n_image
        total["patches"] += sum(patches)
        total["patches_sq"] += sum(p * p for p in patches)
        total["lengths"].append(length)
    return total


def training_flops(shape: dict, work: dict, counts: dict[str, list[int]]) -> float:
    """Model FLOPs of one pass over the dataset (forward + backward), given which parameters train (module
    docstring)."""
    forward = {  # part: (matmuls with weights, attention scores)
        "vision": (
            2 * counts["vision"][1] * work["patches"],
            4 * shape["vision_layers"] * shape["d_vision"] * work["patches_sq"],
        ),
        "projector": (2 * counts["projector"][1] * work["image_tokens"], 0),
        "language": (
            2 * counts["language"][1] * work["tokens"],
            4 * shape["attention_layers"] * shape["d_model"] * work["tokens_sq"] / 2,
        ),
    }
    total, upstream_trains = 0.0, False
    for part in PARTS:  # in the order the forward runs them
        matmuls, attention = forward[part]
        trained, size = counts[part]
        gradient_flows = upstream_trains or trained > 0
        total += matmuls + attention
        if gradient_flows:
            total += matmuls + 2 * attention  # gradients of the activations
        total += matmuls * trained / size  # gradients of the trained weights
        upstream_trains = gradient_flows
    return total


def expected_counts(shape: dict, lora: bool) -> dict[str, list[int]]:
    """Which parameters a variant trains when its trainer's model was not seen: everything, or (LoRA) only
    adapters on the language model (counted as 1 parameter: gradients flow through it, their own cost ~0)."""
    if not lora:
        return {part: [n, n] for part, n in shape["params"].items()}
    return {part: [1 if part == "language" else 0, n] for part, n in shape["params"].items()}


def millions(n: float) -> str:
    return f"{n / 1e6:.3g}M"


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")


def ours_run(key: str, lora: bool, model_dir: Path, work: Path, args) -> dict:
    training = {
        "extends": "DEFAULT_VLM_SFT",
        "max_steps": args.steps,
        "per_device_train_batch_size": args.batch,
        "logging_steps": args.logging_steps,
        "save_strategy": "no",
        **json.loads(args.ours_extra or "{}"),  # a lever under test (bench/NOTES.md)
    }
    config = {
        "project_name": f"bench-vl-{key}-{'lora' if lora else 'full'}",
        "model_name": str(model_dir),
        "training_type": "sft",
        "dataset": {"path": str(work / "vl.jsonl")},
        "training_config": training,
    }
    if lora:
        config["peft_config"] = {"extends": "DEFAULT_VLM_LORA"}
    parts = TrainedParts()
    result = measured_leap_run(config, work / key, warmup_steps=args.warmup_steps, callbacks=[parts])
    return {**result, "peak_gib": peak_gib(), "counts": parts.counts}


def trl_run(key: str, lora: bool, model_dir: Path, work: Path, args) -> dict:
    """TRL SFTTrainer with its defaults for a vision-language model on the same rows."""
    from datasets import Image, Sequence, load_dataset
    from transformers import AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from leap_finetune.recipes.callbacks import MetricsLog

    out = work / key / f"trl-{'lora' if lora else 'full'}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    dataset = load_dataset("json", data_files=str(work / "vl_trl.jsonl"), split="train")
    dataset = dataset.cast_column("images", Sequence(Image()))
    cuda = torch.cuda.is_available()
    training_args = SFTConfig(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        max_length=vlm_max_length(),
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
        bf16=cuda,
        use_cpu=not cuda,
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **lora_options())
    parts = TrainedParts()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer = SFTTrainer(
        model=str(model_dir),
        args=training_args,
        train_dataset=dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
        peft_config=peft_config,
        callbacks=[MetricsLog(out / "metrics.jsonl"), parts],
    )
    collator = type(trainer.data_collator).__name__
    trainer.train()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result = {
        "tokens_per_second": tokens_per_second(out / "metrics.jsonl", warmup_steps=args.warmup_steps),
        "peak_gib": peak_gib(),
        "wall_s": time.perf_counter() - start,
        "losses": [r["loss"] for r in records if r.get("loss") is not None][:4],
        "counts": parts.counts,
        "collator": collator,
    }
    del trainer
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="450m,1.6b")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch", type=int, default=None, help="per-device batch size, both sides (8; --smoke 4)")
    parser.add_argument("--work", default="/tmp/leap-bench-vl")
    parser.add_argument("--out", default=None, help="write the table so far to this file after every variant")
    parser.add_argument("--record", action="store_true", help="append the finished table to bench/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="CPU check: tiny-sized models, 3 steps")
    parser.add_argument("--ours-extra", default=None, help="JSON: training_config keys added to our variants")
    args = parser.parse_args()
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything touches CUDA
        args.models, args.steps, args.logging_steps, args.warmup_steps = "tiny", 3, 1, 1
        args.batch = args.batch or 4
    else:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # one GPU: both sides train in this process
        args.logging_steps, args.warmup_steps = 5, 10
        args.batch = args.batch or 8
    variants = args.variants.split(",")
    for name in variants:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name}; choose from {', '.join(VARIANTS)}")
    models = args.models.split(",")
    for key in models:
        if key not in MODELS:
            parser.error(f"unknown model {key}; choose from {', '.join(MODELS)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    peak = matmul_peak() if cuda else cpu_matmul_peak()
    rows = make_data(work, rows=args.steps * args.batch * 2)
    import trl

    device = torch.cuda.get_device_name(0) if cuda else "CPU (MFU against a float32 matmul peak)"
    lines = [
        f"### {datetime.date.today()} - LFM2-VL image SFT (issue #27) - {device} - torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        f"Matmul peak measured in this run: {peak / 1e12:.3g} TFLOP/s. {len(rows)} rows, one image each "
        f"({', '.join(f'{w}x{h}' for (w, h), _ in SIZES)}); batch {args.batch}, {args.steps} steps, max_length "
        f"{vlm_max_length()}; tokens/s = non-padding input_ids positions (text + image tokens) per second, median "
        f"after step {args.warmup_steps}.",
        "",
        "| model | variant | real tokens/s | MFU | peak GiB | vs TRL | trainable | wall s | first losses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for key in models:
        model_dir = work / f"lfm2-vl-{key}"
        shape = build_model(key, model_dir)
        data = workload(model_dir, rows)
        lengths = data["lengths"]
        title = f"{MODELS[key][0]} ({millions(sum(shape['params'].values()))})"
        full_flops, lora_flops = (
            training_flops(shape, data, expected_counts(shape, lora)) / data["tokens"] for lora in (False, True)
        )
        notes.append(
            f"{title}: parameters vision {millions(shape['params']['vision'])}, projector "
            f"{millions(shape['params']['projector'])}, language {millions(shape['params']['language'])}; "
            f"{data['tokens']:,} tokens, rows {min(lengths)}-{max(lengths)} (mean {statistics.mean(lengths):.0f}), "
            f"image tokens {100 * data['image_tokens'] / data['tokens']:.0f}% of them, "
            f"{data['patches'] / len(rows):.0f} vision patches per row; FLOPs per token: full "
            f"{full_flops / 1e9:.3g} G, LoRA {lora_flops / 1e9:.3g} G; the image processor takes "
            f"{data['image_seconds']:.2f} s per row in one process of this machine."
        )
        results = {}
        for name in variants:
            label, side, lora = VARIANTS[name]
            try:
                run = ours_run if side == "ours" else trl_run
                result = run(key, lora, model_dir, work, args)
            except Exception as err:  # noqa: BLE001 - record a failing variant and go on
                traceback.print_exc()
                first_line = str(err).splitlines()[0][:160] if str(err) else ""
                result = {"error": f"{type(err).__name__}: {first_line}".replace("|", "/")}
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            if "error" not in result:
                counts = result.get("counts") or expected_counts(shape, lora)
                result["flops_per_token"] = training_flops(shape, data, counts) / data["tokens"]
                result["trainable"] = sum(trained for trained, _ in counts.values())
                if result.get("counts") is None:
                    result["trainable_note"] = " (assumed)"
                notes.append(
                    f"{title} {name} trains "
                    + ", ".join(f"{part} {millions(t)} of {millions(n)}" for part, (t, n) in counts.items())
                    + f"; FLOPs per token {result['flops_per_token'] / 1e9:.3g} G."
                )
            results[name] = result
            if args.out:  # after every variant, so a run cut short still leaves its table
                Path(args.out).write_text("\n".join(lines + table_rows(title, results, peak)) + "\n")
        lines += table_rows(title, results, peak)
        collators = {r["collator"] for r in results.values() if "collator" in r}
        if collators:
            notes.append(f"TRL's collator, as SFTTrainer chose it: {', '.join(sorted(collators))}.")
    lines += ["", *notes]
    print("\n".join(lines), flush=True)
    if args.record:
        results_md = Path(__file__).with_name("RESULTS.md")
        results_md.write_text(results_md.read_text().rstrip() + "\n\n" + "\n".join(lines) + "\n")


def table_rows(title: str, results: dict, peak: float) -> list[str]:
    rows = []
    for name, r in results.items():
        label, side, lora = VARIANTS[name]
        if "error" in r:
            rows.append(f"| {title} | {name}: {label} | failed: {r['error']} | | | | | | |")
            continue
        tps = r["tokens_per_second"]
        mfu = tps * r["flops_per_token"] / peak
        baseline = results.get("trl-lora" if lora else "trl-full", {})
        versus = "-"
        if side == "ours" and baseline.get("tokens_per_second") and not math.isnan(tps):
            versus = f"{tps / baseline['tokens_per_second']:.2f}x"
            if baseline["trainable"] and abs(r["trainable"] / baseline["trainable"] - 1) > 0.01:
                versus += " (trains other parameters)"
        memory = "n/a" if math.isnan(r["peak_gib"]) else f"{r['peak_gib']:.1f}"
        losses = ", ".join(f"{loss:.3f}" for loss in r["losses"][:2]) or "-"
        speed = "n/a" if math.isnan(tps) else f"{tps:,.0f}"
        utilisation = "n/a" if math.isnan(mfu) else f"{100 * mfu:.1f}%"
        rows.append(
            f"| {title} | {name}: {label} | {speed} | {utilisation} | {memory} | {versus} | "
            f"{millions(r['trainable'])}{r.get('trainable_note', '')} | {r['wall_s']:.0f} | {losses} |"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
