"""Distillation recipe (`training_type: distill`): SFT's worker - the same prepared rows, masks, packing, speed plan,
LoRA, benchmarks and run folder (recipes/sft.py) - with the teacher's next-token distributions as the target.

The teacher loads beside the student on the same device (bf16 on a GPU, float32 on a CPU), frozen, in evaluation
mode, with the same exact packing (a packed row's documents kept apart in its attention and convolutions too). Each
step both models run the batch to their last hidden states; the loss is taken at the trained tokens, a chunk of
tokens at a time (recipes/distill_loss.py: never the [tokens x vocab] logits of both at once). A served teacher
(`distill.teacher_gpus` / `teacher_base_url`) is not loaded: each step's documents are scored by the server, and
the loss is taken against its top-k log-probs (recipes/distill_server.py).

Logged besides the loss: distill/divergence and distill/cross_entropy (per trained token), mean_token_accuracy
(the student's top-1 against the dataset's token) and distill/teacher_agreement (its top-1 against the teacher's);
with a served teacher, distill/teacher_top_k_mass (the teacher's probability its top-k hold).
"""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.recipes import common, optimizers, sft, speed
from leap_finetune.recipes.ranks import is_main_process
from leap_finetune.recipes.samples import load_samples, print_samples

config_class = sft.config_class


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    args = sft.training_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)
    if resolved.distill and resolved.distill["mode"] == "on_policy":
        args["padding_free"] = False  # (each row's prompt is found in its padded row, and its answer sampled)
    return args


def trainer_class():
    import torch

    from leap_finetune.recipes.distill_loss import DistillLoss, chunked_loss

    class DistillTrainer(sft.trainer_class()):
        """SFT's trainer whose loss is the distillation loss against `teacher` (set after construction)."""

        teacher = None
        teacher_server = None  # a served teacher (recipes/distill_server.py) instead of `teacher`
        spec: DistillLoss | None = None
        on_policy: dict | None = None  # distill.mode on_policy: {max_new_tokens, temperature, eos, pad}
        sampler = False  # on_policy: rl/sampler.py's Sampler, or None where generate samples (False: not decided)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training and self.on_policy is not None:
                return self._on_policy_loss(model, inputs)
            return self._distill_loss(model, inputs, return_outputs, num_items_in_batch, self.spec)

        def _on_policy_loss(self, model, inputs):
            """The divergence on answers the student samples now; with mix, SFT's loss on the rows' own answers."""
            from dataclasses import replace

            from leap_finetune.recipes.distill_on_policy import on_policy_batch, prompts_of, sample_answers

            settings = self.on_policy
            prompts = prompts_of(inputs["input_ids"], inputs["labels"], inputs.get("attention_mask"))
            student = _unwrapped(model)
            if self.sampler is False:  # (decided at the first sampling, said once)
                self.sampler = on_policy_sampler(student, settings, bool(self.args.bf16))
            with self.accelerator.autocast():  # (generate on the unwrapped model: no autocast of its own)
                answers = sample_answers(student, prompts, **settings, sampler=self.sampler)
            sampled = on_policy_batch(prompts, answers, settings["pad"], inputs["input_ids"].device)
            loss = self._distill_loss(model, sampled, False, None, replace(self.spec, mix=0.0))
            if self.spec.mix:
                own = self._distill_loss(model, inputs, False, None, replace(self.spec, mix=1.0), record=False)
                loss = (1 - self.spec.mix) * loss + self.spec.mix * own
            return loss

        def _distill_loss(self, model, inputs, return_outputs, num_items_in_batch, spec, record=True):
            labels = inputs["labels"]
            forward = {k: v for k, v in inputs.items() if k != "labels"}
            forward["use_cache"] = False
            targets = labels[:, 1:]
            trained = targets != -100
            if self.teacher_server is not None:
                total, stats = served_loss(self, model, forward, spec, trained, targets)
            else:
                student, teacher = hidden_states(self.accelerator, model, self.teacher, forward)
                total, stats = chunked_loss(
                    spec,
                    student[:, :-1][trained],
                    teacher[:, :-1][trained],
                    _head(model),
                    _head(self.teacher),
                    targets[trained],
                )
            count = trained.sum() if num_items_in_batch is None else num_items_in_batch
            loss = total / torch.as_tensor(count, device=total.device).clamp(min=1)
            if model.training and self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            if record:
                _record(self, model.training, torch.cat([trained.sum().float().reshape(1), stats]), inputs)
            return (loss, {"loss": loss}) if return_outputs else loss  # (evaluation: the loss alone)

        def _flush_device_metrics(self) -> None:
            super()._flush_device_metrics()
            rows = self._pending().get("distill")
            if rows:
                self._pending()["distill"] = []
                _log_sums(self._metrics["train"], self.accelerator.gather(torch.stack(rows)))

        def log(self, logs, *args, **kwargs):
            sums = self._metrics["eval"].pop("distill_sums", None)
            if sums:
                _log_sums(self._metrics["eval"], self.accelerator.gather(torch.stack(sums)))
            return super().log(logs, *args, **kwargs)

    return DistillTrainer


def on_policy_sampler(student, settings: dict, bf16: bool):
    """The sampler of on-policy answers (recipes/distill_on_policy.py), said once on the terminal and in train.log."""
    from leap_finetune.recipes.distill_on_policy import sampler_for

    sampler, reason = sampler_for(student, **settings, bf16=bf16)
    if is_main_process():
        engine = "leap-finetune's sampler (rl/sampler.py)" if sampler else f"transformers' generate ({reason})"
        print(f"on-policy answers: sampled with {engine}", flush=True)
    return sampler


def served_loss(trainer, model, forward: dict, spec, trained, targets):
    """The loss against the served teacher's top-k of this batch: asked first, answered while the student's forward
    runs."""
    import torch

    from leap_finetune.recipes.distill_loss import chunked_top_k_loss

    pending = trainer.teacher_server.submit(forward) if spec.mix < 1 else None  # (mix 1: the divergence weighs 0)
    with trainer.accelerator.autocast():
        student = _decoder(model)(**forward).last_hidden_state
    if pending is None:
        shape = (*forward["input_ids"].shape, 1)
        ids = torch.zeros(shape, dtype=torch.long, device=student.device)
        logprobs = torch.full(shape, float("-inf"), device=student.device)
    else:
        ids, logprobs = pending.result()
    return chunked_top_k_loss(
        spec, student[:, :-1][trained], _head(model), ids[:, :-1][trained], logprobs[:, :-1][trained], targets[trained]
    )


def _record(trainer, training: bool, row, inputs) -> None:
    """A step's sums [trained tokens, divergence, cross-entropy, right top-1, agreeing top-1], kept on the device
    until logging (recipes/host_syncs.py)."""
    if training:
        pending = trainer._pending()
        pending.setdefault("distill", []).append(row)
        pending["tokens_host"] += int(inputs["input_ids"].numel())
        return
    trainer._metrics["eval"].setdefault("distill_sums", []).append(row)


def _log_sums(metrics: dict, rows) -> None:
    """Per-step rows [trained tokens, divergence, cross-entropy, right top-1, agreeing top-1] -> per-token means."""
    total = rows.sum(0)
    tokens = max(float(total[0]), 1.0)
    metrics["distill/divergence"] = [float(total[1]) / tokens]
    metrics["distill/cross_entropy"] = [float(total[2]) / tokens]
    metrics["mean_token_accuracy"] = [float(total[3]) / tokens]
    metrics["distill/teacher_agreement"] = [float(total[4]) / tokens]
    if total.shape[0] > 5:  # (a served teacher: the probability its top-k hold)
        metrics["distill/teacher_top_k_mass"] = [float(total[5]) / tokens]


def _unwrapped(model):
    model = getattr(model, "module", model)  # (DDP)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def hidden_states(accelerator, model, teacher, forward: dict):
    """Both models' last hidden states of the batch, the student's with gradients. The decoder is called directly
    (the output layer runs in the chunked loss), which bypasses the autocast accelerate wraps around the model's own
    forward: without the accelerator's autocast here the float32 student ran in float32 - twice the activations and
    float32 matmuls (H100, 2026-12-06: 43.0 GiB against the plan's 22.4)."""
    import torch

    with accelerator.autocast():
        student = _decoder(model)(**forward).last_hidden_state
    with torch.no_grad():  # (the teacher as loaded: bf16 on a GPU - under fp16 autocast its residual became float32)
        teacher_hidden = _decoder(teacher)(**forward).last_hidden_state
    return student, teacher_hidden


def _decoder(model):
    """The model without its output layer (its last hidden states, normalised)."""
    inner = _unwrapped(model)
    return inner.model if hasattr(inner, "model") else inner.get_decoder()


def _head(model):
    return _unwrapped(model).get_output_embeddings()


def load_teacher(resolved: ResolvedConfig, tokenizer, packing: bool, console):
    """The teacher, frozen, in bf16 on a GPU (float32 on a CPU), with the student's packing."""
    import torch

    from leap_finetune.models.loading import load_model
    from leap_finetune.models.varlen_attention import use_varlen_attention

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    teacher = load_model(resolved.distill["teacher_id"], tokenizer, {}, dtype=dtype)
    teacher.config.use_cache = False
    teacher.eval().requires_grad_(False)
    if packing:
        use_varlen_attention(teacher)
    parameters = sum(p.numel() for p in teacher.parameters())
    console.print(f"teacher: {resolved.distill['teacher']} ({parameters:,} parameters, {str(dtype)[6:]}, frozen)")
    return teacher


def served_teacher(resolved: ResolvedConfig, tokenizer, console):
    """The teacher server's client (distill.teacher_gpus / teacher_base_url), checked with a first request; None
    for a teacher loaded beside the student."""
    from leap_finetune.recipes.distill_server import TeacherServer

    settings = resolved.distill
    if not settings.get("server_url"):
        return None
    server = TeacherServer(
        settings["server_url"], settings["teacher_top_k"], settings["teacher_timeout_s"], settings["teacher_id"]
    )
    server.check(tokenizer("a b", add_special_tokens=True)["input_ids"][:4] * 2, settings["teacher"])
    console.print(
        f"teacher: {settings['teacher']} served at {settings['server_url']} (model {server.model}; its top "
        f"{settings['teacher_top_k']} log-probs per token)"
    )
    return server


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    from leap_finetune.recipes.distill_loss import DistillLoss

    start = common.start_worker(resolved_json, config_class(), training_arguments)
    resolved, run_dir, console, args = start.resolved, start.run_dir, start.console, start.args
    train_dataset = sft.for_trainer(start.train_dataset, args, args.packing)
    eval_dataset = start.eval_dataset
    if eval_dataset is not None:
        eval_dataset = sft.for_trainer(
            eval_dataset, args, args.packing if args.eval_packing is None else args.eval_packing
        )
    fast = sft.speed_plan(resolved)
    flat = bool(args.padding_free)
    tokenizer, model = common.load_tokenizer_and_model(resolved, packing=args.packing or flat, console=console)
    served = served_teacher(resolved, tokenizer, console)
    teacher = None if served else load_teacher(resolved, tokenizer, args.packing or flat, console)
    if is_main_process():
        console.print(fast.line)
    if resolved.training.get("precision") == "fp8":  # (before compile: the casts are fused into each layer)
        from leap_finetune.recipes.fp8 import use_fp8

        use_fp8(model, console if is_main_process() else None)
    if fast.compile_layers:
        speed.compile_layers(model)
    samples = load_samples(run_dir) if is_main_process() else []
    if samples:
        print_samples(console, "before training", model, tokenizer, samples, None)

    from leap_finetune.recipes.callbacks import StopOnSignal

    stop_on_signal = StopOnSignal()
    trainer_cls = trainer_class()
    trainer_cls.flat_batches = flat
    trainer_cls.batch_tokens = resolved.training.get("batch_tokens")
    settings = resolved.distill
    trainer_cls.spec = DistillLoss(
        settings["loss"], settings["beta"], settings["temperature"], settings["mix"], vocab=len(tokenizer)
    )
    trainer = trainer_cls(
        model=common.with_adapter(resolved, model),
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=common.lora_config(resolved),
        callbacks=common.standard_callbacks(
            resolved,
            run_dir,
            console,
            stop_on_signal,
            speed.with_compile_phase(callbacks, console, fast.compile_layers),
            common.benchmark_callback(resolved, tokenizer, run_dir, console),
        ),
    )
    trainer.teacher = teacher.to(trainer.accelerator.device) if teacher is not None else None
    trainer.teacher_server = served
    if settings["mode"] == "on_policy":
        from leap_finetune.models.loading import end_token_ids

        eos = end_token_ids(tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        trainer.on_policy = {
            "max_new_tokens": settings["max_new_tokens"],
            "temperature": settings["temperature"],
            "eos": eos,
            "pad": pad,
        }
    optimizers.use_precision(trainer, resolved.training.get("optimizer_precision"))
    return common.train_evaluate_save(trainer, resolved, run_dir, tokenizer, console, stop_on_signal, samples)
