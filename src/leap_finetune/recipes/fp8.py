"""`training_config.precision: fp8`: the decoder's linear layers trained through torchao's float8 training - for
each matmul the input and the weight are cast to FP8 with their scales (rowwise: one per row, the recipe torchao
calls accurate enough for training from scratch), the product taken on the GPU's FP8 tensor cores, the result in
bf16. The weights, their gradients and the optimizer stay as they were (float32 master weights by default), so a
checkpoint or an export is the same as a bf16 run's. Why torchao: it is PyTorch's own float8 training (the same
code TorchTitan trains with), and it composes with torch.compile, which fuses the casts into the layer's kernels -
without compiled layers the casts run as separate kernels and FP8 is slower than bf16.

Which layers: nn.Linear of the language model whose two sizes are multiples of 16 (FP8 GEMMs need them) and at least
MIN_FEATURES - not the output layer (its logits feed the loss: kept in bf16, as every float8 recipe does), not LoRA's
small adapter matrices, not a vision encoder or projector.
"""

from __future__ import annotations

RECIPE = "rowwise"  # torchao's Float8LinearConfig recipe name (bench/sft_throughput.py measures tensorwise too)
MIN_FEATURES = 1024  # smaller GEMMs lose more to the casts than FP8 gains (torchao's own guidance)
SKIPPED_PARTS = ("lora_", "vision_tower", "multi_modal_projector")


def fp8_layer(module, name: str) -> bool:
    """Whether the linear layer `name` trains in FP8 (the output layer is excluded by the caller, by identity)."""
    import torch

    if not isinstance(module, torch.nn.Linear) or any(part in name for part in SKIPPED_PARTS):
        return False
    sizes = (module.in_features, module.out_features)
    return all(size % 16 == 0 and size >= MIN_FEATURES for size in sizes)


def use_fp8(model, console=None) -> int:
    """Swap the chosen linear layers for torchao's Float8Linear (before the trainer moves the model, before compile);
    returns how many."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    head = model.get_output_embeddings()
    chosen = {name for name, module in model.named_modules() if module is not head and fp8_layer(module, name)}
    # pad_inner_dim: the weight gradient's matmul (grad_out^T @ input) has the batch's token count as its inner
    # dimension, which FP8 GEMMs on CUDA need as a multiple of 16 - padding-free batches are multiples of 8, padded
    # and on-policy ones any size. torchao pads it (with zeros: the product is unchanged).
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(RECIPE), pad_inner_dim=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _, name: name in chosen)
    if console is not None:
        console.print(f"precision: fp8 matmuls in {len(chosen)} linear layers (torchao float8, {RECIPE} scales)")
    return len(chosen)
