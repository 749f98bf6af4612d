"""`leap-finetune init`: a commented starter config per training type, and the config's JSON schema.

The schema is generated from the pydantic schema (scripts/gen_config_docs.py writes it beside the config
reference; a test keeps it current) and ships inside the package, so the starter's first line points an
editor (the YAML language server: VS Code, Neovim, JetBrains) at it for completion and checking.

The example row comes with the type's row kind; the training_config block is the type's own, else that of the
built-in type starting from the same profile (a copy of SFT gets SFT's), else the profile alone: a type
registered in methods/ has a starter without a line here.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from leap_finetune.methods import CONVERSATION, LABELLED, METHODS, PAIR, PROMPT, TEXT_PAIR, Method, method_of

SCHEMA_FILE = "leap-finetune.schema.json"

# an example row of each row kind
ROWS = {
    CONVERSATION: (
        '{"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]}'
    ),
    PAIR: '{"prompt": "Say gold twice.", "chosen": "gold gold", "rejected": "No."}',
    LABELLED: (
        '{"prompt": [{"role": "user", "content": "Say plum twice."}], '
        '"completion": [{"role": "assistant", "content": "plum plum"}], "label": true}'
    ),
    PROMPT: '{"prompt": "What is 12 * 7? Put the final answer in \\\\boxed{}.", "solution": "84"}',
    TEXT_PAIR: '{"query": "capital of france", "positive": "Paris is the capital of France.", '
    '"negative": "Lyon is a city in France."}',
}

TRAINING = {
    "sft": """training_config:
  extends: DEFAULT_SFT              # TRL's SFT defaults plus ours (docs/config.md lists every profile)
  num_train_epochs: 3
  per_device_train_batch_size: 8
  learning_rate: 2e-5
  max_length: 2048                  # longer conversations are cut; a row with nothing trained left is listed
  # loss_on: assistant              # assistant (default) | final_assistant | all
  # packing: true                   # several conversations per row (faster on GPUs)
""",
    "distill": """teacher: {teacher}          # the model the student learns from: same tokenizer (a Hub id, a folder, a run)
distill:
  loss: forward_kl                  # forward_kl | reverse_kl | jsd (with beta)
  temperature: 1.0
  mix: 0.0                          # the share of SFT's cross-entropy in the loss
training_config:
  extends: DEFAULT_DISTILL          # SFT's rows and masks; the teacher's distributions as the target
  num_train_epochs: 3
  per_device_train_batch_size: 8
  learning_rate: 2e-5
  max_length: 2048
""",
    "dpo": """training_config:
  extends: DEFAULT_DPO              # beta 0.1, learning rate 5e-7, ...
  num_train_epochs: 1
  per_device_train_batch_size: 8
  max_length: 2048
""",
    "kto": """training_config:
  extends: DEFAULT_KTO
  num_train_epochs: 1
  per_device_train_batch_size: 8    # more than 1: KTO's KL term uses the other rows of the batch
  max_length: 2048
  # desirable_weight: 1.0           # the data report says which weights balance your labels
""",
    "grpo": """rewards: [accuracy]                # the completion's final answer against the row's solution; more in docs/grpo.md
training_config:
  extends: DEFAULT_GRPO             # rollouts on vLLM (use_vllm: true): needs vLLM on a CUDA machine
  # use_vllm: false                 # uncomment on a CPU (tiny-lfm2) or without vLLM: leap-finetune's sampler
  per_device_train_batch_size: 16   # prompts x num_generations
  num_generations: 8
  max_completion_length: 256
""",
    "embedding": """retrieval:
  loss: mnrl                        # in-batch negatives; cached_mnrl for large batches in little memory
  prompts: {query: "query: ", document: "document: "}
training_config:
  extends: DEFAULT_EMBEDDING
  per_device_train_batch_size: 64   # each query is scored against the batch's other documents
  learning_rate: 2e-5
  num_train_epochs: 1
""",
    "colbert": """retrieval:
  prompts: {query: "query: ", document: "document: "}
training_config:
  extends: DEFAULT_COLBERT
  per_device_train_batch_size: 64
  learning_rate: 2e-5
  num_train_epochs: 1
""",
}


def schema_path() -> Path:
    """The JSON schema shipped in the package."""
    return Path(str(resources.files("leap_finetune.config") / SCHEMA_FILE))


def json_schema() -> dict:
    from leap_finetune.config.schema import LeapConfigModel

    schema = LeapConfigModel.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "leap-finetune config"
    return schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


# a vision-language model (LFM2-VL): rows with pictures, the parts that train (docs/vision.md)
VISION_ROWS = {
    CONVERSATION: '{"messages": [{"role": "user", "content": [{"type": "image", "image": "images/0001.png"}, '
    '{"type": "text", "text": "What is the total?"}]}, {"role": "assistant", "content": "42.50 EUR"}]}',
    PAIR: '{"prompt": [{"role": "user", "content": [{"type": "image", "image": "images/0001.png"}, '
    '{"type": "text", "text": "What is the total?"}]}], "chosen": "42.50 EUR", "rejected": "40 EUR"}',
}
VISION_TRAINING = {
    "sft": """training_config:
  extends: DEFAULT_VLM_SFT          # SFT defaults for images: max_length 4096, the vision encoder at 0.1x
  num_train_epochs: 3
  per_device_train_batch_size: 2
  learning_rate: 2e-5
  max_length: 4096                  # a row with its image tokens must fit (256 per 512x512 tile): validate says which don't
  # train_vision_encoder: true      # which parts train (LoRA: the language model only)
  # train_projector: true
  # train_language_model: true
  # vision_encoder_lr_multiplier: 0.1

# image_processor:                  # how images become tokens (default: the model's own)
#   max_image_tokens: 256
#   max_tiles: 10
""",
    "dpo": """training_config:
  extends: DEFAULT_DPO              # beta 0.1, learning rate 5e-7, ...
  num_train_epochs: 1
  per_device_train_batch_size: 2
  max_length: 4096                  # the prompt with its image tokens and the longer answer must fit
  # train_vision_encoder: true      # which parts train (LoRA: the language model only)
  # vision_encoder_lr_multiplier: 0.1
""",
}


def training_block(method: Method, vision: bool) -> str:
    """The starter's training_config (and the blocks that go with it: rewards, retrieval) for a type: its own,
    else the block of the built-in type that starts from the same profile, else the profile alone."""
    table, profile = (VISION_TRAINING, method.vision_profile) if vision else (TRAINING, method.profile)
    if method.name in table:
        return table[method.name]
    same = [name for name in table if (METHODS[name].vision_profile if vision else METHODS[name].profile) == profile]
    return table[same[0]] if same else f"training_config:\n  extends: {profile}\n"


def starter(training_type: str, model: str, file_name: str, *, vision: bool = False) -> str:
    """`vision`: the model is a vision-language model (LFM2-VL) and the type trains on images (sft, dpo)."""
    method = method_of(training_type)
    vision = vision and method.images
    lora = (
        ""
        if method.retrieval
        else f"""
# LoRA instead of a full fine-tune (remove the # of both lines):
# peft_config:
#   extends: {"DEFAULT_VLM_LORA" if vision else "DEFAULT_LORA"}
"""
    )
    evals = (
        ""
        if not method.starter_benchmarks
        else """
# Benchmarks before, during and after training (rows in the messages format; docs/evaluation.md):
# evals:
#   benchmarks:
#     - {name: my_bench, path: data/bench.jsonl, metric: exact_match}
"""
    )
    held_out = (
        "  val_path: data/held_out.jsonl        # held-out rows (or test_size: 0.05 to split them off)"
        if method.retrieval
        else "  test_size: 0.05                     # held out for eval loss (or val_path: a file of its own)"
    )
    return f"""# yaml-language-server: $schema={schema_path().as_uri()}
# A leap-finetune starter config: {training_type} on {model}. Every key: docs/config.md, or the schema above
# (your editor completes and checks keys with it).
#
#   leap-finetune validate {file_name}     # the config and EVERY data row, no model loaded
#   leap-finetune inspect {file_name}      # rows as the model sees them, trained tokens highlighted
#   leap-finetune {file_name}              # validate, plan, train
project_name: my-{training_type}
model_name: {model}               # a Hub id, an LFM short name (LFM2-1.2B), a local folder; tiny-lfm2 for a CPU try
training_type: {training_type}

dataset:
  path: data/train.jsonl              # .jsonl, .json, .parquet, .csv, a folder of them, or a Hub dataset id
  # one row per line, e.g.:
  # {(VISION_ROWS if vision else ROWS)[method.rows]}
{held_out}
  # limit: 1000                       # the first N rows only
  # on_invalid: skip                  # drop invalid rows (listed in dropped_rows.jsonl) instead of stopping
{"  # image_root: /data/pictures       # where relative image paths start (default: the data file's folder)" + chr(10) if vision else ""}
{training_block(method, vision).replace("{teacher}", _teacher_for(model))}{lora}{evals}"""


def _teacher_for(model: str) -> str:
    """A larger model of the family for a starter; a built-in tiny model gets another built-in one with its tokenizer
    (a CPU try that validates: a model is refused as its own teacher)."""
    if model.startswith("tiny-"):
        return "tiny-lfm2" if model == "tiny-lfm2.5" else "tiny-lfm2.5"
    return "LiquidAI/LFM2-2.6B"
