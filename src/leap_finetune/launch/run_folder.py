"""The run folder as the driver writes it before any worker starts: the resolved config, the prepared rows, the
samples printed before and after training, the data's fingerprint (a resume checks it), dropped rows - staged
beside the folder and renamed into place, so a failure leaves no half-written run folder. A new run's folder
arrives locked (launch/run_lock.py); a resume refreshes the driver's files one rename at a time."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.yaml_io import dump_yaml
from leap_finetune.data.messages import IMAGE_PLACEHOLDER
from leap_finetune.data.prepared import PreparedData
from leap_finetune.errors import FolderTaken, LeapError
from leap_finetune.launch.plan import record_changes, rewind
from leap_finetune.runs.folder import RunFolder


def write_run_folder(resolved: ResolvedConfig, prepared: PreparedData, renderer, plan):
    """Everything the worker needs, written to a temporary folder and renamed into place, so a
    failure here leaves no half-written run folder. Returns the run folder's lock, held by this process
    (a resume takes it before it changes anything; a new run's folder arrives with it)."""
    from leap_finetune.launch.run_lock import RunLock
    from leap_finetune.quiet import quiet_libraries
    from leap_finetune.signals import clear_request

    quiet_libraries()
    run_dir = Path(resolved.run_dir)
    staging = Path(tempfile_folder(run_dir))
    lock = None
    try:
        if not plan.new_run:
            lock = RunLock.take(run_dir)
        lock = stage_run_folder(resolved, prepared, renderer, plan.new_run, run_dir, staging, lock)
        if not plan.new_run:
            rewind(plan)
            clear_request(run_dir)  # (a stop request of the run that was stopped)
            record_changes(plan, plan.changes)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if lock is not None:
            lock.release()
        raise disk_error(err, run_dir) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if lock is not None:
            lock.release()
        raise
    return lock


def tempfile_folder(run_dir: Path) -> str:
    """A staging folder beside the run folder, of this process alone (two runs never share one); stagings of
    processes of this host that died are removed."""
    import socket
    import tempfile

    from leap_finetune.files import pid_alive

    host = socket.gethostname().replace("-", "_")  # (a shared file system: only this host's processes are known)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    for old in run_dir.parent.glob(f".{run_dir.name}.staging-{host}-*"):
        pid = old.name.rsplit("-", 2)[-2]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f".{run_dir.name}.staging-{host}-{os.getpid()}-", dir=run_dir.parent)


def disk_error(err: OSError, path: Path) -> LeapError:
    """An OSError while writing, said in the user's words: which folder, what the system said, what to do."""
    import errno

    if err.errno == errno.ENOSPC:
        return LeapError(
            f"the disk is full ({err.filename or path})",
            where=str(path),
            fix="free space on that disk (or set output_dir to a disk with space) and run again; "
            "complete checkpoints of the run are intact: resume with resume_from_checkpoint: latest",
        )
    if err.errno == errno.EDQUOT:
        return LeapError(
            f"the disk quota is exceeded ({err.filename or path})",
            where=str(path),
            fix="free space within your quota, or set output_dir elsewhere; complete checkpoints are "
            "intact: resume with resume_from_checkpoint: latest",
        )
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return LeapError(
            f"cannot write there: {err.strerror} ({err.filename or path})",
            where=str(path),
            fix="set output_dir to a folder you can write in",
        )
    return LeapError(
        f"cannot write the run folder: {err.strerror or err}",
        where=str(path),
        fix="check the disk space and permissions there, or set output_dir",
    )


def stage_run_folder(
    resolved: ResolvedConfig, prepared: PreparedData, renderer, new_run: bool, run_dir: Path, staging: Path, lock=None
):
    staging.mkdir(parents=True, exist_ok=True)
    RunFolder(staging).resolved_config.write_text(dump_yaml(resolved.to_json_dict()), encoding="utf-8")
    if resolved.config_path:
        shutil.copy(resolved.config_path, RunFolder(staging).config_copy)
        if resolved.overrides:  # the file as written, and what the command line changed (resolved_config.yaml has both)
            with RunFolder(staging).config_copy.open("a", encoding="utf-8") as handle:
                handle.write(
                    "\n# overridden on the command line:\n" + "".join(f"#   --set {o}\n" for o in resolved.overrides)
                )
    folder = RunFolder(staging)
    for name, rows in (("train", prepared.train), ("eval", prepared.eval)):
        if len(rows):
            rows.dataset().save_to_disk(str(folder.prepared_split(name)))
    folder.samples.write_text(json.dumps(samples(prepared, renderer)), encoding="utf-8")
    folder.fingerprint.write_text(json.dumps(fingerprint(prepared)), encoding="utf-8")
    if prepared.unseen_tool_rows:  # dataset.hold_out_tools: the benchmark the driver added to evals (launch/checks.py)
        RunFolder(staging).unseen_tools.write_text(
            "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in prepared.unseen_tool_rows), encoding="utf-8"
        )
    if resolved.retrieval is not None:  # a built-in tiny backbone, as a folder sentence-transformers loads
        from leap_finetune.models.encoders import save_tiny_backbone

        save_tiny_backbone(resolved, staging)
    if prepared.dropped:
        with RunFolder(staging).dropped_rows.open("w", encoding="utf-8") as handle:
            for row in prepared.dropped:
                handle.write(json.dumps(row.to_json()) + "\n")
    if new_run:
        return _put_in_place(staging, run_dir)
    # resuming: refresh the driver's files, keep checkpoints and metrics. Each is swapped by renames (the
    # old one moved aside, the new one moved in): a kill between them leaves the old or the new, never half.
    for item in staging.iterdir():
        target = run_dir / item.name
        if target.is_dir():
            aside = staging / f".old-{item.name}"
            os.rename(target, aside)
            os.rename(item, target)
        else:
            os.replace(item, target)
    shutil.rmtree(staging)
    return lock


def _put_in_place(staging: Path, run_dir: Path):
    """A new run's staged folder renamed into place, locked: the lock is taken in the staging folder, and rename()
    puts it in place whole, or fails when another run got there first (a non-empty folder is never replaced, but
    for what a run stopped during start-up left there: nothing in it can be resumed)."""
    from leap_finetune.launch.run_lock import LOCK_NAME, RunLock, busy_error, is_live, read_holder

    replaced = _set_aside(run_dir)  # (first: when a live run holds the folder, it raises holding nothing)
    lock = None
    try:
        lock = RunLock.take(staging)
        left = run_dir / LOCK_NAME  # the lock file of a run that used the folder and ended before a checkpoint
        if left.exists() and not any(p.name != LOCK_NAME for p in run_dir.iterdir()):
            if not is_live(run_dir):
                left.unlink(missing_ok=True)
        os.rename(staging, run_dir)
    except OSError as err:
        if lock is not None:
            lock.release()
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        shutil.rmtree(staging, ignore_errors=True)
        if (run_dir / LOCK_NAME).exists() and is_live(run_dir):
            busy = busy_error(run_dir, read_holder(run_dir), "output_dir")
            raise FolderTaken(busy.message, where=busy.where, fix=busy.fix) from None
        raise FolderTaken(
            "the output folder exists and is not empty",
            where=str(run_dir),
            fix="choose another output_dir, remove the folder, or resume with resume_from_checkpoint: latest",
        ) from None
    finally:
        if replaced is not None:
            replaced[1].release()
            shutil.rmtree(replaced[0], ignore_errors=True)
    lock.moved_to(run_dir)
    return lock


def _set_aside(run_dir: Path):
    """What a run stopped during start-up left in `run_dir` (launch/resume_latest.py: no checkpoint, no model),
    moved into a staging folder of this process, under that run's lock (a live run's folder is never touched):
    (the folder, the lock) for the caller to remove and release once the new run is in place, or None. A kill
    before that leaves a staging folder, which the next run of this host removes."""
    from leap_finetune.launch.resume_latest import startup_leftover
    from leap_finetune.launch.run_lock import RunLock

    if not startup_leftover(run_dir):
        return None
    old = RunLock.take(run_dir, where="output_dir")  # (the error naming the run, if one is live there)
    if not startup_leftover(run_dir):  # (changed before the lock was ours)
        old.release()
        return None
    aside = Path(tempfile_folder(run_dir))
    os.rename(run_dir, aside / run_dir.name)
    return aside, old


def fingerprint(prepared: PreparedData) -> dict:
    """A hash of the token ids the trainer will read (train and eval), in order: a resume checks that
    the data are the run's (the data position in a checkpoint means nothing for other data)."""
    return {
        "train": prepared.train.fingerprint(),
        "eval": prepared.eval.fingerprint(),
        "train_rows": len(prepared.train),
        "eval_rows": len(prepared.eval),
    }


def samples(prepared: PreparedData, renderer) -> list[dict]:
    """Prompts whose answers the worker prints before and after training."""
    samples = []
    for conversation in prepared.sample_messages:
        messages = conversation.messages
        answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not answers:
            continue
        # A tool-use conversation is best judged on its first tool call; others on the final answer.
        calls = [i for i in answers if "<|tool_call_start|>" in messages[i]["content"]]
        target = calls[0] if calls else answers[-1]
        users = [m for m in messages[:target] if m["role"] == "user"]
        prompt = renderer.prompt_text(messages[:target], conversation.tools)
        sample = {
            "prompt": prompt,
            "question": users[-1]["content"] if users else "",
            "reference": messages[target]["content"],
        }
        images = getattr(conversation, "images", None)
        if images:  # (a vision-language run: the pictures of the prompt, in order)
            sample["images"] = [ref.source for ref in images[: prompt.count(IMAGE_PLACEHOLDER)]]
        samples.append(sample)
    return samples
