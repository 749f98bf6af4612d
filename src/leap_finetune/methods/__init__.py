"""One home for what each training type is (issue #26): its name as the config writes it, the profile it starts
from, the rows it reads, the metrics its evaluation logs, the keys and blocks it adds, and what a run of it
produces, in the words the messages use.

Modules ask the type's `Method` ("does it read conversations?", "does it train on rewards?", "what does a colbert
run train?") instead of comparing `training_type` with names of their own: a new type (image SFT is next) is added
once, here, and every question about it is answered at once - the config rules, the data step, `plan`, the
reports, the model card. tests/test_methods.py walks every type through every rule.

Ground floor: imports nothing of the package, so config, data, models and launch can all ask. What a type *does*
(its trainer) is its recipe, the module `recipe_module` names (`recipes/<name>.py` unless the Method says
otherwise), imported by `recipes.recipe` when a run needs it, never here.

The lists of names (`training_types()`, `retrieval_types()`) are read from `METHODS` when asked, not copied when
this module loads: a type `register`ed later (tests/e2e/test_new_training_type.py: SFT under another name) is in
every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

# the rows a method reads (data/: each kind has its checker and its tokenizer)
CONVERSATION = "conversation"  # messages (+ tools): SFT
PAIR = "preference pair"  # prompt, chosen, rejected: DPO
LABELLED = "labelled completion"  # prompt, completion, label: KTO
PROMPT = "prompt"  # a prompt (+ solution and columns for the rewards): GRPO
TEXT_PAIR = "text pair"  # query, document (+ negatives): embedding, ColBERT

# training_config keys of a vision-language run (types with a vision_profile): which parts train, and the vision
# encoder's learning rate as a multiple of learning_rate
VISION_KEYS = ("train_vision_encoder", "train_projector", "train_language_model", "vision_encoder_lr_multiplier")


@dataclass(frozen=True)
class Method:
    name: str  # training_type as written in the config
    family: str  # generation (sft), preference (dpo, kto), reinforcement (grpo), retrieval (embedding, colbert)
    profile: str  # the training_config profile a config starts from (and `init` extends)
    trains: str  # what the run produces, as messages say it
    rows: str  # the row kind it reads (one of the constants above)
    # what metric_for_best_model may name (without "eval_"): the metrics the type's evaluation logs
    eval_metrics: tuple[str, ...]
    # training_config keys leap-finetune adds to the trainer's own (loss_on: which tokens SFT trains on)
    own_keys: tuple[str, ...] = ()
    # TRL fuses the LM head into the loss (SFT): torch_compile of the whole model is refused for compile_layers
    fused_lm_loss: bool = False
    # train_sampling_strategy batch_rebalance / group_by_length (they read each row's input_ids)
    length_samplers: bool = False
    # KTO's KL estimate pairs each row with its neighbours: order and batch sizes are constrained
    kl_pairs: bool = False
    # padded batches may run through the model as one flat row (models/flat_rows.py; `padding_free`), in place of
    # the TRL trainer's own padding-free path (disabled in TRL 1.16's DPO, absent from its KTO)
    flat_rows: bool = False
    # GRPO: completions sampled and scored (rewards:, grpo_rollout:, a generation batch, a rollout engine)
    rewards: bool = False
    # distillation: a teacher model's next-token distributions are the target (`teacher:`, `distill:`)
    teacher: bool = False
    # a sentence-transformers model (no chat template, no LoRA starter, retrieval metrics): the class that loads it
    encoder_class: str | None = None
    # max_length cuts rows (and the prepared rows are large enough to spill to Arrow files as they come)
    cut_by_max_length: bool = False
    # the starter config (`init`) suggests benchmarks (generation and log-prob benchmarks of chat models)
    starter_benchmarks: bool = False
    # the library's training-arguments class the type's training_config keys belong to ("module:Class")
    arguments: str = ""
    # the library's trainer class the recipe builds ("module:Class"): a training process imports it first, quickly
    # (recipes.recipe(..., to_train=True))
    trainer: str = ""
    # with a vision-language model (LFM2-VL): rows may carry image parts, the vision keys apply
    # (VISION_KEYS), and this is the profile a config starts from (None: images are refused)
    vision_profile: str | None = None
    # the module of its recipe (recipes.Recipe: config_class, training_arguments, train); "" is
    # leap_finetune.recipes.<name>. A type may share another's (a copy of SFT under another name trains with SFT's).
    recipe_module: str = ""

    def __post_init__(self):
        if not self.recipe_module:
            object.__setattr__(self, "recipe_module", f"leap_finetune.recipes.{self.name}")

    @property
    def images(self) -> bool:
        return self.vision_profile is not None

    @property
    def retrieval(self) -> bool:
        return self.encoder_class is not None

    @property
    def multi_vector(self) -> bool:
        """One vector per token (ColBERT's late interaction) rather than one per text."""
        return self.encoder_class == "MultiVectorEncoder"

    @property
    def replaces_trainer_padding_free(self) -> bool:
        """Its flat rows stand in for a `padding_free` that the trainer's arguments have of their own (TRL 1.16's
        DPO: disabled there, it warns and pads), which the recipe then turns off. Where `padding_free` is
        leap-finetune's key (own_keys: KTO, the encoders) the trainer's arguments have none to turn off."""
        return self.flat_rows and "padding_free" not in self.own_keys

    def arguments_class(self):
        """TRL's (or sentence-transformers') config class, imported when asked (the library is loaded only then)."""
        import importlib

        module, _, name = self.arguments.partition(":")
        return getattr(importlib.import_module(module), name)


# What the evaluation of each type logs (read from real runs of TRL's trainers and of the retrieval recipe).
_CHAT = ("loss", "mean_token_accuracy", "entropy", "num_tokens")
_DPO = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "mean_token_accuracy",
    "entropy",
    "num_tokens",
)
_KTO = (
    "loss",
    "kl",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "entropy",
    "num_tokens",
)
# TRL's GRPOTrainer on a held-out split, besides rewards/<name>/mean|std (named by the config's rewards)
_GRPO = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "loss",
    "entropy",
    "num_tokens",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)
# sentence-transformers' loss; the retrieval evaluator's retrieval_<score>_<metric>@k are matched by pattern
_RETRIEVAL = ("loss", "sequential_score")

# a mixture-of-experts model's router losses (models/moe_router.py): the causal-LM training types
ROUTER_KEYS = ("router_aux_loss_coef", "router_z_loss_coef")
# the own keys of the types that train on SFT's conversations (sft, distill)
CHAT_KEYS = (
    "loss_on",
    "loss_on_thinking",
    "compile_layers",
    "optimizer_precision",
    "precision",
    "batch_tokens",
    *ROUTER_KEYS,
)

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "sft",
            "generation",
            "DEFAULT_SFT",
            "a language model (chat)",
            CONVERSATION,
            _CHAT,
            own_keys=CHAT_KEYS,
            fused_lm_loss=True,
            length_samplers=True,
            cut_by_max_length=True,
            starter_benchmarks=True,
            arguments="trl:SFTConfig",
            trainer="trl:SFTTrainer",
            vision_profile="DEFAULT_VLM_SFT",
        ),
        Method(
            "distill",
            "generation",
            "DEFAULT_DISTILL",
            "a language model (chat) distilled from a teacher",
            CONVERSATION,
            _CHAT,
            own_keys=CHAT_KEYS,
            length_samplers=True,
            cut_by_max_length=True,
            starter_benchmarks=True,
            teacher=True,
            arguments="trl:SFTConfig",
            trainer="trl:SFTTrainer",
        ),
        Method(
            "dpo",
            "preference",
            "DEFAULT_DPO",
            "a language model (chat) tuned on preference pairs",
            PAIR,
            _DPO,
            own_keys=("compile_layers", "optimizer_precision", "reference_adapter", *ROUTER_KEYS),
            flat_rows=True,
            cut_by_max_length=True,
            starter_benchmarks=True,
            arguments="trl:DPOConfig",
            trainer="trl:DPOTrainer",
            vision_profile="DEFAULT_DPO",
        ),
        Method(
            "kto",
            "preference",
            "DEFAULT_KTO",
            "a language model (chat) tuned on desirable/undesirable answers",
            LABELLED,
            _KTO,
            own_keys=("compile_layers", "optimizer_precision", "padding_free", "reference_adapter", *ROUTER_KEYS),
            kl_pairs=True,
            flat_rows=True,
            cut_by_max_length=True,
            starter_benchmarks=True,
            arguments="trl:KTOConfig",
            trainer="trl:KTOTrainer",
        ),
        Method(
            "grpo",
            "reinforcement",
            "DEFAULT_GRPO",
            "a language model (chat) tuned on rewards",
            PROMPT,
            _GRPO,
            own_keys=("reference_adapter", *ROUTER_KEYS),
            rewards=True,
            arguments="trl:GRPOConfig",
            vision_profile="DEFAULT_GRPO",
            trainer="trl:GRPOTrainer",
        ),
        Method(
            "embedding",
            "retrieval",
            "DEFAULT_EMBEDDING",
            "an embedding model (one vector per text)",
            TEXT_PAIR,
            _RETRIEVAL,
            own_keys=("compile_layers", "padding_free"),  # (recipes/retrieval.py: the encoder's speed plan)
            encoder_class="SentenceTransformer",
            arguments="sentence_transformers:SentenceTransformerTrainingArguments",
            trainer="sentence_transformers:SentenceTransformerTrainer",
        ),
        Method(
            "colbert",
            "retrieval",
            "DEFAULT_COLBERT",
            "a ColBERT model (one vector per token)",
            TEXT_PAIR,
            _RETRIEVAL,
            own_keys=("compile_layers", "padding_free"),  # (recipes/retrieval.py: the encoder's speed plan)
            encoder_class="MultiVectorEncoder",
            arguments="sentence_transformers.multi_vector_encoder:MultiVectorEncoderTrainingArguments",
            trainer="sentence_transformers.multi_vector_encoder:MultiVectorEncoderTrainer",
        ),
    )
}


def register(method: Method) -> Method:
    """Add a training type: from now on every question about types (config rules, `validate`, the data step, the
    recipe, the reports) knows it. A name already taken is refused (a type is changed where it is defined)."""
    if method.name in METHODS:
        raise ValueError(f"training type {method.name!r} is registered already")
    METHODS[method.name] = method
    return method


def training_types() -> tuple[str, ...]:
    """Every training type's name, in the order registered (the built-in ones first)."""
    return tuple(METHODS)


def retrieval_types() -> tuple[str, ...]:
    return tuple(name for name, m in METHODS.items() if m.retrieval)


def __getattr__(name: str):
    # TRAINING_TYPES / RETRIEVAL_TYPES, the names tests and users import: the lists as they are when imported (the
    # package's own code calls training_types() where it decides)
    if name == "TRAINING_TYPES":
        return training_types()
    if name == "RETRIEVAL_TYPES":
        return retrieval_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def method_of(of) -> Method:
    """The Method of a training type's name, or of anything with a `training_type` (a config, a resolved config)."""
    name = of if isinstance(of, str) else of.training_type
    return METHODS[name]


def same_rows(training_type: str, other: str) -> bool:
    """Both types read the same row kind (`dataset.type: sft` under distill: the rows are read the same way)."""
    return training_type in METHODS and other in METHODS and METHODS[training_type].rows == METHODS[other].rows


def is_retrieval(training_type: str | None) -> bool:
    """Embedding or ColBERT training: (query, document) pairs, a sentence-transformers model, retrieval metrics."""
    return training_type in METHODS and METHODS[training_type].retrieval


def trained_by(encoder_class: str) -> str:
    """The retrieval type whose models load with this sentence-transformers class (a folder's
    config_sentence_transformers.json names it); SentenceTransformer for an unknown one."""
    for name, m in METHODS.items():
        if m.encoder_class == encoder_class:
            return name
    return trained_by("SentenceTransformer")
