"""Training steps that do not wait for the GPU: the step's metrics stay on the device until logging.

Every `.item()` (or `if tensor:`) on a CUDA tensor makes the host wait until the GPU has finished all
the work queued so far; the GPU then idles while Python launches the next kernels. The profile of an
LFM2-1.2B SFT step (bench/profile_step.py --shapes) counted 12 such waits per step, most of them for
numbers that are only shown every `logging_steps`: TRL's SFTTrainer reads entropy, token accuracy and
the token count with `.item()` between the forward and the backward pass of every step, and the
Trainer reads the number of tokens seen. Neither library offers a switch for this, so this mixin
keeps those sums as device tensors and reads them once per logging step (and before a checkpoint is
written), with the same values TRL and the Trainer would have logged.

`PendingTokensSeen` is the part every trainer can use (the Trainer's count of tokens seen; the retrieval
trainer counts every text column). Only the plain loss path is taken over (TRL's fused LM-head loss, `nll` or `dft`); anything else
(a custom loss function, label smoothing, MoE auxiliary losses, sequence parallelism, evaluation)
goes to TRL unchanged.
"""

from __future__ import annotations


class PendingTokensSeen:
    """Mixin for a Trainer (placed before it in the bases): `state.num_input_tokens_seen` is added to on the device
    (`_add_input_tokens`) and read where every process passes - before a log, an evaluation or a checkpoint, and
    at the end of training."""

    def _pending(self) -> dict:
        if not hasattr(self, "_leap_pending"):
            # device tensors (no wait to make them) and host integers (no copy to the GPU per step)
            self._leap_pending = {"steps": [], "inputs": None, "inputs_host": 0, "tokens": None, "tokens_host": 0}
        return self._leap_pending

    def _add_input_tokens(self, count) -> None:
        """A count of tokens seen: a device tensor, or a host integer."""
        pending = self._pending()
        if isinstance(count, int):
            pending["inputs_host"] += count
        else:
            pending["inputs"] = count if pending["inputs"] is None else pending["inputs"] + count

    def _flush_device_metrics(self) -> None:
        """Read the pending sums (one wait for the GPU) into the state the Trainer logs from. Called by every
        process at the same points (the gathers are collective); all processes have the same pending kinds."""
        import torch

        pending = self._pending()
        if pending["inputs"] is not None or pending["inputs_host"]:
            count = torch.tensor(pending["inputs_host"], device=self.accelerator.device, dtype=torch.int64)
            if pending["inputs"] is not None:
                count = count + pending["inputs"].to(torch.int64)
            self.state.num_input_tokens_seen += int(self.accelerator.gather(count.reshape(1)).sum().item())
            pending["inputs"], pending["inputs_host"] = None, 0

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        if self.control.should_log or self.control.should_evaluate or self.control.should_save:
            self._flush_device_metrics()
        return super()._maybe_log_save_evaluate(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._flush_device_metrics()  # TRL's eval_num_tokens reads the training count
        return super().evaluate(*args, **kwargs)

    def _finalize_training(self, *args, **kwargs):
        self._flush_device_metrics()  # the last steps since the last log, before the final log
        return super()._finalize_training(*args, **kwargs)

    def _save_checkpoint(self, model, trial):
        self._flush_device_metrics()  # the checkpoint's trainer_state.json holds the tokens seen so far
        return super()._save_checkpoint(model, trial)


class DeviceSideMetrics(PendingTokensSeen):
    """Mixin for TRL's SFTTrainer (placed before it in the bases)."""

    def _plain_loss_path(self, model) -> bool:
        parallelism = getattr(self.accelerator, "parallelism_config", None)
        return (
            model.training
            and self.compute_loss_func is None
            and self.label_smoother is None
            and not self.aux_loss_enabled
            and not (parallelism is not None and getattr(parallelism, "sp_enabled", False))
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        if return_outputs or not self._plain_loss_path(model):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # TRL's plain path (SFTTrainer.compute_loss, trl 1.16), without its per-step `.item()` calls
        inputs["use_cache"] = False
        outputs = model(**inputs, fused_lm_head=True)
        per_token_loss = -outputs.log_probs  # zero on ignored positions
        if self.args.loss_type == "dft":
            per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        pending = self._pending()
        with torch.no_grad():
            pending["steps"].append(
                torch.stack(
                    [
                        outputs.label_mask.sum().float(),
                        outputs.entropy.detach().sum().float(),
                        outputs.is_top1.sum().float(),
                    ]
                )
            )
            # TRL's num_tokens counts every position of the batch (a flat batch's padding to a multiple of 8 too)
            if "attention_mask" in inputs:
                batch_tokens = inputs["attention_mask"].sum()
                pending["tokens"] = batch_tokens if pending["tokens"] is None else pending["tokens"] + batch_tokens
            else:
                pending["tokens_host"] += inputs["position_ids"].size(1)
        return loss

    def _track_num_input_tokens(self, inputs):
        """The Trainer's count of tokens seen (transformers 5), summed on the device."""
        mode = self.args.include_num_input_tokens_seen
        main = getattr(self.model, "main_input_name", "input_ids")
        if mode in ("no", False) or main not in inputs:
            return super()._track_num_input_tokens(inputs)
        pad = getattr(self.processing_class, "pad_token_id", None)
        if mode == "non_padding" and "attention_mask" in inputs:
            self._add_input_tokens(inputs["attention_mask"].sum())
        elif mode == "non_padding" and pad is not None:
            self._add_input_tokens((inputs[main] != pad).sum())
        else:
            self._add_input_tokens(inputs[main].numel())

    def _flush_device_metrics(self) -> None:
        """The tokens seen, then TRL's token count, entropy and token accuracy (see PendingTokensSeen)."""
        import torch

        super()._flush_device_metrics()
        pending = self._pending()
        device = self.accelerator.device
        if pending["tokens"] is not None or pending["tokens_host"]:
            tokens = torch.tensor(pending["tokens_host"], device=device, dtype=torch.int64)
            if pending["tokens"] is not None:
                tokens = tokens + pending["tokens"].to(torch.int64)
            # gather, not gather_for_metrics: at the end of an epoch the latter drops the other ranks' entries
            self._total_train_tokens += int(self.accelerator.gather(tokens.reshape(1)).sum().item()) // self._tp_size
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            pending["tokens"], pending["tokens_host"] = None, 0
        if pending["steps"]:
            steps = torch.stack(pending["steps"])  # (steps, 3): valid tokens, entropy sum, correct
            gathered = self.accelerator.gather(steps.unsqueeze(0)).reshape(-1, *steps.shape).sum(0)
            valid = gathered[:, 0]
            for name, column in (("entropy", 1), ("mean_token_accuracy", 2)):
                per_step = torch.where(valid > 0, gathered[:, column] / valid.clamp(min=1), torch.zeros_like(valid))
                self._metrics["train"][name].extend(per_step.tolist())
            pending["steps"] = []


def score_trained_tokens_only_on_cpu() -> None:
    """TRL's fused output layer (trl 1.16 add_fused_lm_head) scores only the positions with a label on Triton devices
    and every position elsewhere, so that an accelerator compiling per shape (Neuron) sees fixed shapes. A CPU runs
    eagerly - no shape to keep - and there the prompt and padding positions were most of a small model's step (the
    output layer over a 65k vocabulary is most of its FLOPs): the CPU scores the trained positions only as well.
    Same values: the other positions' log-probs are zeros either way."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton  # (read by the fused head alone in that module, for this choice)
    if getattr(original, "leap_cpu_compact", False):
        return

    def compact(device) -> bool:
        return original(device) or device.type == "cpu"

    compact.leap_cpu_compact = True
    compact.original = original
    trl_utils._use_triton = compact
