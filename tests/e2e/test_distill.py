"""`training_type: distill` end to end on CPU (docs/distillation.md): a tiny teacher trained on a fact task; a fresh
student learns the task from rows where 40% of the answers are wrong faster per step by distillation than by SFT on
the same rows (its cross-entropy on held-out right answers falls further in the same steps: the teacher knows the
task better than the rows); the run logs the divergence and the teacher agreement, the card names the teacher,
`plan` counts the teacher's memory; a teacher served by leap-finetune's own server (teacher_base_url, its top-k
log-probs) teaches as the loaded one does, and `plan` puts a teacher_gpus server on a GPU of its own; what cannot
work is refused at validate, and a teacher server that does not answer stops the run with exit 2 naming it."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from leap_finetune.api import run_config
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl
from tests.watchdog import Watchdog, wait_until

STEPS = 48


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> tuple[Path, str]:
    """(the folder with train.jsonl and val.jsonl, the teacher's model folder): tiny-lfm2 after SFT on the task."""
    folder = tmp_path_factory.mktemp("distill")
    write_jsonl(folder / "clean.jsonl", fact_rows(64))
    write_jsonl(folder / "train.jsonl", _noisy(fact_rows(64)))
    write_jsonl(folder / "val.jsonl", fact_rows(16))
    config = tiny_config(
        project_name="teacher",
        dataset={"path": "clean.jsonl", "val_path": "val.jsonl"},
        training_config={"max_steps": 120, "learning_rate": 3e-3, "eval_steps": 120, "save_strategy": "no"},
    )
    return folder, run_config(write_config(folder, config, "teacher.yaml"))["model_dir"]


def _noisy(rows: list[dict]) -> list[dict]:
    """40% of the answers replaced by another row's ("Say red twice." -> "blue blue")."""
    rng = random.Random(0)
    answers = [row["messages"][-1]["content"] for row in rows]
    for row in rows:
        if rng.random() < 0.4:
            row["messages"][-1]["content"] = rng.choice([a for a in answers if a != row["messages"][-1]["content"]])
    return rows


def _student(folder: Path, name: str, **extra) -> dict:
    config = tiny_config(
        project_name=name,
        dataset={"path": "train.jsonl", "val_path": "val.jsonl"},
        training_config={"max_steps": STEPS, "learning_rate": 3e-3, "eval_steps": STEPS, "save_strategy": "no"},
        **extra,
    )
    if extra:
        config["training_config"]["extends"] = "DEFAULT_DISTILL"
    summary = run_config(write_config(folder, config, f"{name}.yaml"))
    logs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "logs": logs}


@pytest.fixture(scope="module")
def sft(task) -> dict:
    """SFT of a fresh student on the rows with wrong answers: what distillation is measured against."""
    return _student(task[0], "sft")


def test_a_distilled_student_learns_faster_than_sft_on_the_same_rows(task, sft):
    folder, teacher = task
    distilled = _student(folder, "student", training_type="distill", teacher=teacher, distill={"temperature": 1.0})
    sft_loss = sft["summary"]["eval_loss"]  # (SFT's eval loss is the cross-entropy of the held-out right answers)
    evals = [r for r in distilled["logs"] if "eval_distill/cross_entropy" in r]
    first, last = evals[0], evals[-1]
    assert last["eval_distill/cross_entropy"] < 0.95 * sft_loss, (last, sft_loss)  # (measured: 0.66 vs 0.75)
    assert last["eval_distill/divergence"] < first["eval_distill/divergence"] / 2  # the loss falls
    assert last["eval_distill/teacher_agreement"] > first["eval_distill/teacher_agreement"]
    trained = [r for r in distilled["logs"] if "distill/divergence" in r]
    assert trained and all(0 <= r["distill/teacher_agreement"] <= 1 for r in trained)
    card = (Path(distilled["summary"]["run_dir"]) / "model" / "README.md").read_text()
    assert f"distilled from teacher `{teacher}` (offline, forward_kl, temperature 1" in card


def test_on_policy_the_student_learns_from_the_teacher_on_its_own_answers(task):
    """mode on_policy: each step the student answers the rows' prompts itself and the teacher scores those answers:
    its top-1 comes to agree with the teacher's and its cross-entropy on held-out right answers falls. The answers
    are sampled on leap-finetune's rollout sampler (GRPO's). (From a fresh
    student it is slower than SFT per step - measured 2.00 against 0.75 after 48 steps, docs/distillation.md: GKD
    starts from a warmed-up student.) With mix the rows' own answers add SFT's loss."""
    folder, teacher = task
    settings = {"mode": "on_policy", "max_new_tokens": 8}
    on_policy = _student(folder, "on-policy", training_type="distill", teacher=teacher, distill=settings)
    evals = [r for r in on_policy["logs"] if "eval_distill/cross_entropy" in r]
    assert evals[-1]["eval_distill/cross_entropy"] < evals[0]["eval_distill/cross_entropy"] / 2, evals
    trained = [r for r in on_policy["logs"] if "distill/teacher_agreement" in r]
    assert trained[0]["distill/teacher_agreement"] < 0.1 and trained[-1]["distill/teacher_agreement"] > 0.3, trained
    said = (Path(on_policy["summary"]["run_dir"]) / "train.log").read_text()
    assert "on-policy answers: sampled with leap-finetune's sampler" in said  # (rl/sampler.py, as GRPO's rollouts)
    mixed = _student(folder, "mixed", training_type="distill", teacher=teacher, distill={**settings, "mix": 0.5})
    assert mixed["summary"]["global_step"] == STEPS


@contextlib.contextmanager
def _served(model: str, log: Path):
    """leap-finetune's own server (evaluation/serve.py) on the model, on 127.0.0.1: its /v1 URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with log.open("wb") as out:
        command = [
            sys.executable,
            "-m",
            "leap_finetune.evaluation.serve",
            model,
            "--port",
            str(port),
            "--device",
            "cpu",
        ]
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

        def healthy():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    return answer.status == 200
            except OSError:
                return False

        try:
            wait_until(healthy, Watchdog(process.pid, what="the teacher server"), poll_s=0.2, proc=process)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_a_served_teacher_teaches_as_the_loaded_one(task, sft):
    """distill.teacher_base_url: the teacher's top 20 log-probs per token from the server; the student learns the
    task from them as from the loaded teacher (its held-out cross-entropy below SFT's on the same rows)."""
    folder, teacher = task
    with _served(teacher, folder / "teacher-server.log") as url:
        settings = {"teacher_base_url": url, "teacher_top_k": 20}
        served = _student(folder, "served", training_type="distill", teacher=teacher, distill=settings)
    evals = [r for r in served["logs"] if "eval_distill/cross_entropy" in r]
    assert evals[-1]["eval_distill/cross_entropy"] < 0.95 * sft["summary"]["eval_loss"], evals
    trained = [r for r in served["logs"] if "distill/teacher_top_k_mass" in r]
    assert trained and all(0 < r["distill/teacher_top_k_mass"] <= 1.0001 for r in trained)
    assert "/v1/completions" in (folder / "teacher-server.log").read_text()  # (the server was asked, not bypassed)


def test_a_teacher_server_that_does_not_answer_stops_the_run_naming_it(task, tmp_path):
    folder, teacher = task
    with socket.socket() as probe:  # (a port nothing listens on)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config(
        training_type="distill",
        teacher=teacher,
        distill={"teacher_base_url": f"http://127.0.0.1:{port}/v1", "teacher_timeout_s": 5},
        dataset={"path": "train.jsonl"},
        training_config={"extends": "DEFAULT_DISTILL", "max_steps": 2},
    )
    result = invoke("run", str(write_config(tmp_path, config)))
    said = result.stderr + result.stdout
    assert result.returncode == 2 and f"nothing answers at http://127.0.0.1:{port}/v1" in said, said
    assert "connection was refused" in said and "Traceback" not in said


def test_a_server_of_another_model_than_the_teacher_is_refused(task, tmp_path):
    """The server answers, but serves another model: its log-probs are not the teacher's (here another tokenizer
    too), so validate stops before anything loads, naming both."""
    folder, teacher = task
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    with _served("tiny-lfm2.5-vl", tmp_path / "other-server.log") as url:
        config = tiny_config(
            training_type="distill",
            teacher=teacher,
            distill={"teacher_base_url": url},
            dataset={"path": "train.jsonl"},
            training_config={"extends": "DEFAULT_DISTILL", "max_steps": 2},
        )
        result = invoke("validate", str(write_config(tmp_path, config)))
    said = result.stderr + result.stdout
    assert result.returncode == 2, said
    assert "serves 'tiny-lfm2.5-vl', and teacher is" in said and "--served-model-name" in said, said


def test_plan_serves_a_teacher_on_gpus_of_its_own(task, tmp_path):
    folder, teacher = task
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config(
        training_type="distill",
        teacher=teacher,
        distill={"teacher_gpus": 1},
        dataset={"path": "train.jsonl"},
        training_config={"extends": "DEFAULT_DISTILL", "max_steps": 2},
    )
    path = write_config(tmp_path, config)
    planned = invoke("plan", str(path), "--json", "--gpus", "2")
    assert planned.returncode == 0, planned.stderr
    shown = json.loads(planned.stdout)
    assert shown["devices"]["teacher"] == [0] and shown["devices"]["training"] == [1]
    (server,) = [p for p in shown["processes"] if p["name"].startswith("teacher server")]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "0" and teacher in server["command"]
    assert shown["teacher"]["weights_gib"] == 0  # (the training GPU holds no teacher)
    too_few = invoke("plan", str(path), "--gpus", "1")
    assert too_few.returncode == 2 and "1 for the teacher server (distill.teacher_gpus)" in too_few.stderr


def test_plan_counts_the_on_policy_samplers_copy_and_caches(tmp_path):
    """mode on_policy samples on leap-finetune's sampler: its bf16 copy of the student and static caches sit beside
    the training step (memory/servers.py), as GRPO's rollouts do."""
    from leap_finetune.memory.plan import predict, shape_of
    from leap_finetune.memory.servers import kv_bytes
    from leap_finetune.validate.loader import load_config

    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config(training_type="distill", teacher="tiny-lfm2.5", dataset={"path": "train.jsonl"})
    config["distill"] = {"mode": "on_policy", "max_new_tokens": 64}
    config["training_config"]["extends"] = "DEFAULT_DISTILL"
    resolved = load_config(write_config(tmp_path, config))
    shape = shape_of(resolved)
    cache = predict(resolved, shape, longest=100).cache
    assert cache > 2 * shape.parameters + kv_bytes(shape, 4, 164)  # (the copy, and caches for 4 prompts + 64 tokens)
    offline = resolved.model_copy(update={"distill": {**resolved.distill, "mode": "offline"}})
    assert predict(offline, shape, longest=100).cache == 0


def test_plan_counts_the_teacher_and_lora_distils_too(task):
    folder, teacher = task
    config = tiny_config(
        training_type="distill",
        teacher=teacher,
        dataset={"path": "train.jsonl"},
        training_config={"extends": "DEFAULT_DISTILL", "max_steps": 4},
        peft_config={"extends": "DEFAULT_LORA"},
    )
    path = write_config(folder, config, "lora.yaml")
    planned = invoke("plan", str(path), "--json", "--gpus", "1", "--gpu-memory", "24GiB")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["teacher"]["model"] == teacher
    shown = invoke("plan", str(path))
    assert f"teacher: {teacher} (frozen, bf16 beside the student" in shown.stdout + shown.stderr
    from leap_finetune.memory.estimate import training_memory
    from leap_finetune.memory.plan import setup_of, shape_of
    from leap_finetune.validate.loader import load_config

    resolved = load_config(path)
    setup = setup_of(resolved, shape_of(resolved))
    assert setup.teacher_bytes == 2 * shape_of(resolved).parameters  # (the tiny teacher has the student's shape)
    without = training_memory(shape_of(resolved), setup.__class__(**{**setup.__dict__, "teacher_bytes": 0}))
    assert training_memory(shape_of(resolved), setup).weights == without.weights + setup.teacher_bytes
    summary = run_config(path)
    assert summary["global_step"] == 4 and (Path(summary["run_dir"]) / "adapter").is_dir()


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"training_type": "distill"}, "needs a teacher"),
        ({"training_type": "distill", "teacher": "tiny-lfm2.5-vl"}, "another tokenizer than the student"),
        ({"teacher": "tiny-lfm2.5"}, "'teacher:' applies to training_type: distill"),
        ({"training_type": "distill", "teacher": "tiny-lfm2.5", "distill": {"beta": 0.2}}, "beta weighs loss jsd"),
        ({"training_type": "distill", "teacher": "tiny-lfm2", "distill": {"mode": "on_policy"}}, "student's own model"),
        ({"training_type": "distill", "teacher": "tiny-lfm2.5", "distill": {"mix": 1}}, "cross-entropy alone"),
        (
            {
                "training_type": "distill",
                "teacher": "tiny-lfm2.5",
                "distill": {"mode": "on_policy"},
                "training_config": {"packing": True},
            },
            "one conversation per row",
        ),
        ({"training_type": "distill", "teacher": "tiny-lfm2.5", "distill": {"max_new_tokens": 8}}, "mode is offline"),
        ({"training_type": "distill", "teacher": "./nowhere"}, "teacher"),
        ({"training_type": "distill", "teacher": "./train.jsonl"}, "train.jsonl is a file"),  # (not `hf download`)
        (
            {
                "training_type": "distill",
                "teacher": "tiny-lfm2.5",
                "distill": {"mode": "on_policy", "max_new_tokens": 100000},
                "training_config": {"max_length": 128},
            },
            "distill.max_new_tokens is 100000, but training_config.max_length is 128",
        ),
        (
            {
                "training_type": "distill",
                "teacher": "tiny-lfm2.5",
                "distill": {"teacher_gpus": 1, "teacher_base_url": "http://h:1/v1"},
            },
            "keep one",
        ),
        (
            {
                "training_type": "distill",
                "teacher": "tiny-lfm2.5",
                "distill": {"teacher_gpus": 1, "loss": "reverse_kl"},
            },
            "use loss: forward_kl with a served teacher",
        ),
        (
            {"training_type": "distill", "teacher": "tiny-lfm2.5", "distill": {"teacher_top_k": 50}},
            "applies to a served",
        ),
        ({"training_type": "distill", "teacher": "tiny-lfm2.5", "distill": {"teacher_base_url": "h:1"}}, "http://"),
        (
            {
                "training_type": "distill",
                "teacher": "tiny-lfm2.5",
                "distill": {"teacher_base_url": "http://h:99999/v1"},
            },
            "port is not a number from 1 to 65535",
        ),
        (
            {
                "training_type": "distill",
                "teacher": "tiny-lfm2.5",
                "distill": {"teacher_base_url": "http://u:pw@h:1/v1"},
            },
            "holds a user name or password",
        ),
        ({"training_type": "distill", "teacher": "tiny-lfm2.5", "distill": {"teacher_gpus": 1}}, "no GPU is visible"),
    ],
)
def test_what_cannot_work_is_refused_at_validate(tmp_path, config, said):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    full = tiny_config(dataset={"path": "train.jsonl"}, **{k: v for k, v in config.items() if k != "training_config"})
    full["training_config"].update(config.get("training_config", {}))
    if config.get("training_type") == "distill":
        full["training_config"]["extends"] = "DEFAULT_DISTILL"
    result = invoke("validate", str(write_config(tmp_path, full)))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert ":pw@" not in result.stderr  # (a password in a URL is never repeated)


def test_sft_rows_are_distill_rows(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config(training_type="distill", teacher="tiny-lfm2.5", dataset={"path": "train.jsonl", "type": "sft"})
    config["training_config"]["extends"] = "DEFAULT_DISTILL"
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["dataset"]["type"] == "sft"


def test_a_distill_key_error_carries_its_own_fix_line(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config(training_type="distill", teacher="tiny-lfm2.5", distill={"beta": 0.2})
    config["training_config"]["extends"] = "DEFAULT_DISTILL"
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2 and "fix: remove beta, or set loss: jsd" in result.stderr, result.stderr
    assert "docs/config.md for every key" not in result.stderr


def test_a_teacher_port_in_use_is_refused_before_the_server_starts():
    """(the driver's check itself: teacher_gpus needs GPUs, which this machine has not)"""
    from types import SimpleNamespace

    from leap_finetune.errors import LeapError
    from leap_finetune.launch.checks import check_teacher_server
    from leap_finetune.launch.devices import plan_devices

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        resolved = SimpleNamespace(distill={"teacher_port": port}, config_path="config.yaml")
        with pytest.raises(LeapError, match=f"port {port} is in use by another process: the teacher server"):
            check_teacher_server(resolved, plan_devices(gpus=2, teacher=1))


def test_a_teacher_with_the_students_weights_under_another_name_is_refused(task, tmp_path):
    """A copy of the student's folder as its teacher (mix 0): the divergence is 0 from the first step - refused as
    the same name is; a teacher whose weights differ (the fine-tuned teacher against its copy with one byte changed
    at the end) is taken."""
    import shutil

    folder, teacher = task
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    student, copy = tmp_path / "student", tmp_path / "copy"
    shutil.copytree(teacher, student)
    shutil.copytree(teacher, copy)
    config = tiny_config(model_name=str(student), training_type="distill", teacher=str(copy), distill={"mix": 0})
    config["training_config"]["extends"] = "DEFAULT_DISTILL"
    result = invoke("validate", str(write_config(tmp_path, config)))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and f"the same weights as {student}" in said and "nothing would train" in said, said
    [weights] = copy.glob("*.safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # (the last byte: the comparison reads to the end before it differs)
    weights.write_bytes(bytes(data))
    assert invoke("validate", str(write_config(tmp_path, config))).returncode == 0
