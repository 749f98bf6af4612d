"""Reading GGUF files: transformers' dequantiser learns ggml's Q5_0 / Q5_1 blocks from the gguf package (llama-quantize
writes them for k-quant rows that are not a multiple of 256), the converter's copy of gguf/ is checked, and the
type list refuses what llama.cpp does not make."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leap_finetune.errors import LeapError


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1"])
def test_transformers_reads_q5_blocks_as_the_gguf_reference_does(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    from transformers.integrations.gguf import dequant

    from leap_finetune.models.gguf import _read_q5_blocks

    quant = GGMLQuantizationType[kind]
    values = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    blocks = quantize(values, quant)  # (4, bytes per row): what llama-quantize writes
    _read_q5_blocks()
    ours = dequant.dequantize(torch.from_numpy(blocks.reshape(-1).copy()), quant.value)
    reference = dequantize(blocks, quant).reshape(-1)
    assert torch.equal(ours, torch.from_numpy(reference.copy()))
    assert np.abs(reference - values.reshape(-1)).max() < 0.1  # (and it is a quantization of the values)


def test_the_installed_gguf_files_are_the_converters_copy():
    from leap_finetune.gguf_export.convert import check_converter

    check_converter()  # scripts/setup.sh installs the converter last; export says how to restore it otherwise


def test_gguf_types_are_parsed_in_order_once_and_unknown_ones_refused():
    from leap_finetune.gguf_export.types import needs_quantize, parse_types, source_type

    assert parse_types(["F16,q8_0", "q4_k_m", "q8_0"]) == ["f16", "q8_0", "q4_k_m"]
    assert needs_quantize(["q8_0", "q4_k_m"]) and not needs_quantize(["f16", "q8_0"])
    assert source_type(["q4_k_m"], "bfloat16") == "bf16" and source_type(["q4_k_m"], "float16") == "f16"
    assert source_type(["q4_k_m"], "float32") == "f32" and source_type(["q4_k_m"], None) == "f32"
    assert source_type(["f16", "q4_k_m"], "bfloat16") == "f16"
    with pytest.raises(LeapError) as raised:
        parse_types(["q4_k_x"])
    assert "unknown GGUF type 'q4_k_x'" in raised.value.message and "q4_k_m" in raised.value.fix
    with pytest.raises(LeapError):
        parse_types([" , "])
