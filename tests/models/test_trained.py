"""`chat`, `export` and `eval` ask one TrainedModel what is in a folder: the same model, the same adapter base."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.evaluation.standalone import model_to_evaluate
from leap_finetune.models.trained import TrainedModel, find_trained


def _eval_target(checkpoint, model_name: str = "tiny-lfm2") -> TrainedModel:
    # (model_to_evaluate reads the config's checkpoint and model_id only)
    return model_to_evaluate(SimpleNamespace(checkpoint=str(checkpoint), model_id=model_name))


def test_chat_export_and_eval_find_the_same_adapter_over_the_same_base(tmp_path):
    run = tmp_path / "outputs" / "demo" / "sft-20261201-120000"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "recorded/base"}))
    (run / "resolved_config.yaml").write_text("model_id: tiny-lfm2\ntraining_type: sft\n")

    found, evaluated = find_trained(str(run)), _eval_target(run, "another/model")
    assert found.adapter_dir == (run / "adapter").resolve() and found.model_id == "tiny-lfm2"  # the run's base
    assert (evaluated.adapter_dir, evaluated.model_id) == (run / "adapter", "tiny-lfm2")
    assert found.run_config == evaluated.run_config == {"model_id": "tiny-lfm2", "training_type": "sft"}
    assert found.name == f"{run.resolve() / 'adapter'} (LoRA adapter over tiny-lfm2)"

    (run / "resolved_config.yaml").unlink()  # no run config: the base the adapter records
    assert find_trained(str(run)).model_id == _eval_target(run).model_id == "recorded/base"

    (run / "adapter" / "adapter_config.json").write_text("{}")  # no record either: eval falls back to model_name
    assert _eval_target(run, "another/model").model_id == "another/model"
    with pytest.raises(LeapError, match="does not say which model it adapts"):
        find_trained(str(run))  # (chat and export have no model_name to fall back to)


def test_eval_takes_a_gguf_file_and_refuses_what_holds_no_model(tmp_path):
    gguf = tmp_path / "export-gguf" / "demo-q8_0.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    target = _eval_target(gguf)
    assert (target.gguf_file, target.model_id) == (gguf, str(gguf.parent))
    assert target.name == f"{gguf} (GGUF, dequantised)"
    with pytest.raises(LeapError, match="no model in this folder"):
        _eval_target(tmp_path / "export-gguf")
    with pytest.raises(LeapError, match="no model here"):
        find_trained(str(tmp_path / "export-gguf"))
