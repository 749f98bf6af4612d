"""Evaluation that does not pause training, reserved mode, with real components: the reserved evaluator is a real
evaluation server process (evaluation/serve.py, FastAPI + uvicorn) on 127.0.0.1 answering a real
`leap-finetune eval --server` process, on CPU (vllm_gpus: 0). Its results, logged at the training step of each
snapshot, equal the sync run's at the same steps; a killed server is counted and training finishes. (Sidecar mode,
with SLURM jobs: test_async_eval_sidecar.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from tests.conftest import EXAMPLES, tiny_config, write_config
from tests.evaluation.async_runs import (
    async_config,
    failures_by_step,
    free_port,
    one_core_each,
    scores_by_step,
    sync_run,
)
from tests.watchdog import Watchdog, wait_until

__all__ = ["one_core_each", "sync_run"]  # (fixtures of this module, defined with the runs they set up)


class KillFirstServer(threading.Thread):
    """Kills the first evaluation server once it is up and the evaluation client has started (the client's
    log exists; it is still importing): that evaluation fails, training goes on."""

    def __init__(self, port: int, outputs: Path):
        super().__init__(daemon=True)
        self.port, self.outputs, self.killed, self.error = port, outputs, False, None

    def run(self):
        # (the run trains in this process: the watchdog follows it and the server it started)
        try:
            wait_until(
                lambda: list(self.outputs.glob("*/*/benchmarks/jobs/step-0.log")),
                Watchdog(os.getpid(), what="the run"),
                poll_s=0.1,
            )
        except AssertionError as err:  # (a thread's exception would be lost: the test reports it)
            self.error = err
            return
        subprocess.run(["pkill", "-9", "-f", f"serve .*--port {self.port}"])
        self.killed = True


@pytest.mark.slow
def test_reserved_server_gives_the_sync_results_and_a_killed_server_is_a_counted_failure(workdir, sync_run, capfd):
    _, sync_scores = sync_run
    port = free_port()
    killer = KillFirstServer(port, workdir / "outputs")
    killer.start()
    # batch_size 4: the server generates requests that arrive together as one batch (sync generated one by one)
    summary = run_config(
        async_config(
            workdir,
            "reserved",
            "reserved.yaml",
            evals={"batch_size": 4, "eval_steps": 6},  # (steps 0, 6, 12: the server of step 0 killed)
            on_overlap="skip",
            reserved={"server_port": port},
        )
    )
    killer.join(timeout=5)
    assert killer.killed, killer.error
    run_dir = Path(summary["run_dir"])
    assert summary["global_step"] == 12
    assert failures_by_step(run_dir) == {0: 1.0}
    scores = scores_by_step(run_dir)
    assert 12 in scores and 0 not in scores
    for step, result in scores.items():  # the server's greedy answers and the client's log-probs: as sync
        assert result == pytest.approx(sync_scores[step], rel=1e-6), step
    err = " ".join(capfd.readouterr().err.split())
    assert (
        "evaluation at step 0 (before training) failed: the evaluation server exited (code -9) during the evaluation; its log:"
        in err
    ), err[-3000:]
    assert "start the server (e.g. `vllm serve" not in err  # (eval --server's advice is not for a reserved run)
    server_log = (run_dir / "benchmarks" / "jobs" / "step-12-server.log").read_text()
    assert server_log.count("POST /v1/chat/completions") == 12  # the generation benchmark went through the server
    assert summary["benchmarks"] == {k: v for k, v in scores[12].items() if k.endswith("/score")}
    predictions = (run_dir / "benchmarks" / "capitals.jsonl").read_text().splitlines()  # the last evaluation's
    assert len(predictions) == 12 and "prediction" in json.loads(predictions[0])


class KillServerAfterReload(threading.Thread):
    """Kills the in_place server once it has loaded a second snapshot's weights: the next snapshot finds it gone."""

    def __init__(self, port: int, outputs: Path):
        super().__init__(daemon=True)
        self.port, self.outputs, self.killed, self.error = port, outputs, False, None

    def run(self):
        def reloaded():
            logs = list(self.outputs.glob("*/*/benchmarks/jobs/server.log"))
            return logs and "loaded the weights of" in logs[0].read_text(errors="replace")

        try:
            wait_until(reloaded, Watchdog(os.getpid(), what="the run"), poll_s=0.1)
        except AssertionError as err:
            self.error = err
            return
        subprocess.run(["pkill", "-9", "-f", f"serve .*--port {self.port}"])
        self.killed = True


@pytest.mark.slow
def test_reserved_in_place_reload_gives_the_sync_results_from_one_server(workdir, sync_run, capfd):
    """`weight_reload: in_place`: one evaluation server for the run, each later snapshot's weights loaded into it
    (vLLM's reload requests, which leap-finetune's server answers); the results keyed by step equal sync mode's at
    every step. A server killed between
    snapshots is started again on the next one (said in the log), and the results still equal sync's."""
    sync_summary, sync_scores = sync_run
    port = free_port()
    killer = KillServerAfterReload(port, workdir / "outputs")
    killer.start()
    summary = run_config(
        async_config(
            workdir,
            "reserved",
            "in_place.yaml",
            evals={"batch_size": 4, "eval_steps": 6},  # (steps 0, 6, 12: a reload at 6, a restart at 12)
            reserved={"server_port": port, "weight_reload": "in_place"},
        )
    )
    killer.join(timeout=5)
    assert killer.killed, killer.error
    run_dir = Path(summary["run_dir"])
    assert summary["global_step"] == 12
    scores = scores_by_step(run_dir)
    failed = failures_by_step(run_dir)
    assert 12 in scores and len(scores) + len(failed) == 3 and len(failed) <= 1, (scores.keys(), failed)
    for step, result in scores.items():
        assert result == pytest.approx(sync_scores[step], rel=1e-6), step
    # the generation benchmark is the one the server answers: its answers at the last step (a reloaded snapshot)
    # are the sync run's. (This tiny model answers alike before and after training, so that the server really
    # answers with the reloaded weights is shown by tests/evaluation/test_serve_reload.py, with models that differ.)
    answers = [json.loads(line)["prediction"] for line in (run_dir / "benchmarks" / "capitals.jsonl").open()]
    sync_run_dir = Path(sync_summary["run_dir"])
    assert answers == [
        json.loads(line)["prediction"] for line in (sync_run_dir / "benchmarks" / "capitals.jsonl").open()
    ]
    log = (run_dir / "benchmarks" / "jobs" / "server.log").read_text()
    assert log.count("$ ") == 2  # started twice: at the first snapshot, and after the kill
    assert log.count("loaded the weights of") >= 1 and log.count("POST /collective_rpc") >= 1
    assert log.count("POST /reset_prefix_cache") >= 1  # (vLLM's KV cache of the old weights: emptied)
    assert not list((run_dir / "benchmarks" / "jobs").glob("step-*-server.log"))  # (respawn's one log per step)
    err = " ".join(capfd.readouterr().err.split())
    # killed after a reload: that snapshot's evaluation failed (the kept server then dropped) or, had it finished
    # first, the next snapshot found the server gone (or saw it die while it was loading that snapshot's weights) -
    # either way a new one was started
    assert len(failed) == 1 or re.search(
        r"the evaluation server (had exited|exited while loading the weights of \S+): starting the evaluation "
        "server again",
        err,
    ), err[-3000:]
    assert "starting the evaluation server again for step" in err  # (said in the run's log either way)
    # seconds of evaluation for a fraction of a second of training between two: said once, with what to change
    assert err.count("longer than the") == 1 and "s of training between two evaluations" in err
    assert "Evaluate less often (a larger evals.eval_steps) or fewer rows." in err
    left = subprocess.run(["pgrep", "-f", f"serve .*--port {port}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # stopped at the end of training


@pytest.mark.slow
def test_reserved_server_answers_image_benchmarks_with_their_images(workdir):
    """A tiny LFM2-VL trained with async_eval reserved and image benchmarks: each snapshot is saved with its
    processor, our evaluation server is sent the images as image_url parts and reads them, and the scores of
    step 0 (the untrained model) are the ones `leap-finetune eval` gives in this process."""
    from leap_finetune.api import evaluate_config

    shutil.copy(EXAMPLES / "data" / "quickstart.jsonl", workdir / "train.jsonl")
    shutil.copytree(EXAMPLES / "data" / "images", workdir / "images")
    for name in ("fruit_images_generation.jsonl", "fruit_images_mcq.jsonl"):
        shutil.copy(EXAMPLES / "data" / name, workdir / name)
    evals = {
        "max_new_tokens": 8,
        "batch_size": 4,
        "eval_steps": 2,
        "benchmarks": [
            {"name": "fruits", "path": "fruit_images_generation.jsonl", "metric": "exact_match", "limit": 4},
            {"name": "fruits_mcq", "path": "fruit_images_mcq.jsonl", "metric": "logprob_mcq", "limit": 4},
        ],
    }
    config = tiny_config(
        model_name="tiny-lfm2.5-vl",
        training_config={"max_steps": 2, "per_device_train_batch_size": 4, "save_steps": 100},
        evals=evals,
        async_eval={"mode": "reserved", "vllm_gpus": 0, "reserved": {"server_port": free_port()}},
    )
    summary = run_config(write_config(workdir, config, "reserved_vl.yaml"))
    run_dir = Path(summary["run_dir"])
    assert summary["global_step"] == 2 and failures_by_step(run_dir) == {}
    scores = scores_by_step(run_dir)
    assert sorted(scores) == [0, 2]
    local = evaluate_config(write_config(workdir, {"model_name": "tiny-lfm2.5-vl", "evals": evals}, "local.yaml"))
    expected = {k: v for k, v in local["results"].items() if not k.endswith("/seconds")}
    assert scores[0] == pytest.approx(expected, rel=1e-6)
    for step in (0, 2):  # each server generated the 4 rows of the generation benchmark with their 4 images
        server_log = (run_dir / "benchmarks" / "jobs" / f"step-{step}-server.log").read_text()
        assert server_log.count("POST /v1/chat/completions") == 4
        served = [line.split(" with ")[1].split()[0] for line in server_log.splitlines() if "image(s) in" in line]
        assert sum(map(int, served)) == 4, server_log[-2000:]


def test_a_lora_snapshot_is_the_merged_model_and_training_weights_are_untouched(tmp_path):
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from leap_finetune.evaluation.snapshot import merged_state_dict
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    model = get_peft_model(
        build_tiny_model("tiny-lfm2", tokenizer, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", modules_to_save=["lm_head"]),
    )
    with torch.no_grad():  # trained-looking adapters (B starts at zero) and a changed saved module
        for name, parameter in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                parameter.add_(torch.randn_like(parameter) * 0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state_dict(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # training weights untouched
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    for key, value in expected.items():
        assert torch.allclose(merged[key], value, atol=1e-6), key
    # the snapshot folder loads as a plain model with the adapted model's outputs (the changed lm_head no longer
    # tied to the embeddings)
    from transformers import AutoModelForCausalLM

    from leap_finetune.evaluation.snapshot import save_model_folder

    save_model_folder(model, tmp_path / "snapshot")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "snapshot", dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 13]])
    assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-5)
    assert model.get_base_model().config.tie_word_embeddings  # the training model's config is unchanged


def test_a_resume_logs_again_the_async_results_up_to_its_checkpoint(tmp_path):
    """Async results arrive after the checkpoint of their step is marked, so the resume's cut of metrics.jsonl
    drops them: they are logged again from results/step-N.json; later steps' results are removed (re-evaluated)."""
    from leap_finetune.launch.plan import restore_benchmark_results

    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for step, score in ((0, 0.25), (3, 0.5), (6, 0.75)):
        (results / f"step-{step}.json").write_text(
            json.dumps({"step": step, "when": "x", "results": {"benchmark/mcq/score": score}})
        )
    metrics = tmp_path / "metrics.jsonl"
    # as cut back to the checkpoint of step 3: step 0's results had arrived before that save, step 3's after
    metrics.write_text(
        json.dumps({"step": 0, "benchmark/mcq/score": 0.25}) + "\n" + json.dumps({"step": 3, "loss": 1.0}) + "\n"
    )
    restore_benchmark_results(tmp_path, metrics, 3)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "benchmark/mcq/score" in r] == [0, 3]
    assert records[-1] == {"step": 3, "benchmark/mcq/score": 0.5}
    assert sorted(p.name for p in results.iterdir()) == ["step-0.json", "step-3.json"]


def test_in_place_starts_a_new_server_when_a_snapshot_unties_the_output_head(workdir, capfd):
    """A LoRA run whose adapter moved the tied embeddings and output head apart saves that snapshot untied
    (evaluation/snapshot.py); a server built on a tied model cannot hold both (vLLM's reload would keep one), so
    in_place starts a new server for it instead of reloading, and says why."""
    import threading

    from leap_finetune.evaluation.reserved import ReservedServer
    from leap_finetune.evaluation.snapshot import Snapshot
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer
    from leap_finetune.validate.loader import load_config

    resolved = load_config(
        async_config(
            workdir, "reserved", "tie.yaml", reserved={"server_port": free_port(), "weight_reload": "in_place"}
        )
    )
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    model = build_tiny_model("tiny-lfm2", tokenizer)
    snapshots = []
    for step, tied in ((1, True), (2, False)):
        folder = workdir / f"step-{step}"
        model.config.tie_word_embeddings = tied
        model.save_pretrained(folder / "model")
        tokenizer.save_pretrained(folder / "model")
        snapshots.append(Snapshot(step, "during training", folder))
    stopped = threading.Event()
    stopped.set()  # (the evaluation client stops at once: what is tested is which server serves the snapshot)
    jobs = workdir / "jobs"
    jobs.mkdir()
    server = ReservedServer(resolved, workdir)
    try:
        for snapshot in snapshots:
            server(resolved, snapshot, jobs, stopped)
        assert server.started == 2 and server.tied is False
    finally:
        server.close()
    err = " ".join(capfd.readouterr().err.split())
    assert "step 2's model has its own output head (no longer tied to the embeddings): starting the evaluation" in err
    assert "POST /collective_rpc" not in (jobs / "server.log").read_text()  # (not reloaded: started again)
