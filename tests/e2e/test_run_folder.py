"""What a person reads in the run folder: train.log."""

from __future__ import annotations

from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


def test_train_log_holds_the_runs_output_as_plain_text_and_a_resume_appends(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(24))
    config = write_config(tmp_path, tiny_config(data="train.jsonl", training_config={
        "max_steps": 4, "save_steps": 2, "logging_steps": 1}))
    first = invoke(str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    [run_dir] = list((tmp_path / "outputs" / "test").iterdir())
    log = (run_dir / "train.log").read_text()
    assert log.startswith("==== ") and "leap-finetune" in log.splitlines()[0]
    for printed in ("resolved config", "data: 24 rows read", f"run: {run_dir}", "done: 4 steps"):
        assert printed in log, printed
    assert "\x1b[" not in log and "\r" not in log
    # every line the run printed is in the log, in order
    printed = [line.strip() for line in first.stderr.splitlines() if line.strip()]
    logged = [line.strip() for line in log.splitlines() if line.strip()]
    position = 0
    for line in printed:
        position = logged.index(line, position) + 1
    # a resumed run appends (a header of its own), the first run's lines are kept
    more = write_config(tmp_path, tiny_config(data="train.jsonl", output_dir=str(run_dir), training_config={
        "max_steps": 6, "save_steps": 2, "logging_steps": 1, "resume_from_checkpoint": "latest"}), name="more.yaml")
    second = invoke(str(more), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    log = (run_dir / "train.log").read_text()
    assert log.count("==== ") == 2 and "done: 4 steps" in log and "done: 6 steps" in log
    assert log.index("done: 4 steps") < log.index("resuming from") < log.index("done: 6 steps")
