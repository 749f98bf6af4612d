"""Prepared data kept on disk, so `run` after `validate` (or a second run on the same data) does not
check and tokenize every row again.

An entry is keyed by everything the prepared rows depend on: the data files' bytes, the tokenizer
(its full serialisation), the chat template, max_length, truncation, loss_on, the training type, the
dataset keys (limit, split, test_size, seed, weights, ...), this package's version, the data step's own code and its libraries' versions. Settings that
do not change the rows (packing, learning rate, batch size) are not in the key. Hub datasets are not
cached: without the Hub their content has no fingerprint here (`datasets` keeps its own download cache).

An entry is written to a temporary folder and renamed into place with a manifest of its files' sizes and
SHA-256 written last; an entry whose manifest is missing or does not match is deleted and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from leap_finetune import __version__
from leap_finetune.data.prepared import DroppedRow, PreparedData, SourceReport, dataset_items
from leap_finetune.data.table import RowTable
from leap_finetune.files import pid_alive
from leap_finetune.runs.atomic import swap_in

FORMAT = 1
CACHE_FOLDER = "leap-finetune/prepared"  # under the cache base (not a run folder's prepared/)
KEEP = 8  # entries kept (the most recently used); each is about the size of its data's token ids


@dataclass
class Entry:
    folder: Path
    key: str


def cache_root() -> Path:
    configured = os.environ.get("LEAP_FINETUNE_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_FOLDER


def entry_for(resolved, tokenizer, renderer, sources, examples: int) -> Entry | None:
    """The cache entry for this data step, or None where it cannot be keyed (a Hub dataset, a slow tokenizer)."""
    if any(not s.local for s in sources) or not getattr(tokenizer, "is_fast", False):
        return None
    digest = hashlib.sha256()

    def add(label: str, value) -> None:
        digest.update(label.encode() + b"=" + json.dumps(value, sort_keys=True, default=str).encode() + b"\n")

    add("format", [FORMAT, __version__, _code_digest(), _library_versions()])
    add("type", [resolved.training_type, resolved.loss_on, resolved.model_family, resolved.chat_template])
    add("thinking", getattr(renderer, "loss_on_thinking", True))
    add("datasets", [item.model_dump(exclude={"num_proc", "cache"}) for item in dataset_items(resolved)])
    add("rows", [resolved.training.get("seed", 42), resolved.samples, examples])
    add(
        "tokenizer",
        [
            type(tokenizer).__name__,
            hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest(),
            tokenizer.bos_token,
            tokenizer.eos_token,
            tokenizer.pad_token,
        ],
    )
    template = getattr(renderer, "template", None)
    add(
        "renderer",
        [
            type(renderer).__name__,
            getattr(template, "text", None),
            getattr(template, "training", None),
            getattr(renderer, "max_length", None),
            getattr(renderer, "truncation_mode", None),
            getattr(renderer, "query_prompt", None),
            getattr(renderer, "document_prompt", None),
            getattr(renderer, "query_max", None),
            getattr(renderer, "document_max", None),
            # a vision-language run: the settings that decide each image's tokens (the images themselves are
            # re-read per batch, and a changed one is caught there by its token count)
            renderer.reader.describe() if getattr(renderer, "reader", None) is not None else None,
        ],
    )
    for source in sources:
        for file in source.files:
            add("file", [str(file), file.stat().st_size, _file_digest(file)])
    key = digest.hexdigest()
    return Entry(cache_root() / key[:40], key)


def _code_digest() -> str:
    """The data step's own code: a fix to rendering or masking must not be served stale rows."""
    digest = hashlib.sha256()
    folder = Path(__file__).parent
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _library_versions() -> list:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("tokenizers", "transformers", "jinja2", "pyarrow"):
        try:
            found.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            found.append(f"{name}: none")
    return found


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def load(entry: Entry, console):
    """The prepared data of a complete, intact entry; None (after deleting a broken one) otherwise."""
    from leap_finetune.data.messages import ImageRef
    from leap_finetune.data.sft_rows import Conversation, RowWarning

    manifest_path = entry.folder / "manifest.json"
    if not entry.folder.exists():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("key") != entry.key:
            raise ValueError("the manifest names another key")
        for name, (size, sha) in manifest["files"].items():
            path = entry.folder / name
            if path.stat().st_size != size or _file_digest(path) != sha:
                raise ValueError(f"{name} does not match the manifest")
        report = json.loads((entry.folder / "report.json").read_text(encoding="utf-8"))
        changed = _images_changed(report)
        if changed:
            if console is not None:
                console.print(f"[dim]data: {changed} since the rows were prepared: preparing them again[/dim]")
            return None
        splits = {name: _read_split(entry.folder, name) for name in ("train", "eval")}
        splits["train"].examples = report["examples"]
        splits["train"].known_fingerprint, splits["eval"].known_fingerprint = report["fingerprints"]
        prepared = PreparedData(
            train=splits["train"],
            eval=splits["eval"],
            rows_read=report["rows_read"],
            dropped=[DroppedRow(**d) for d in report["dropped"]],
            invalid_skipped=report["invalid_skipped"],
            fully_truncated=report["fully_truncated"],
            partially_truncated=report["partially_truncated"],
            sample_messages=[
                Conversation(c["messages"], c["tools"], [ImageRef(*r) for r in c.get("images", [])])
                for c in report["sample_messages"]
            ],
            warnings=[RowWarning(**w) for w in report["warnings"]],
            warning_rows=report["warning_rows"],
            notices=report["notices"],
            sources=[SourceReport(**s) for s in report["sources"]],
            tool_split=report["tool_split"],
            unseen_tool_rows=report["unseen_tool_rows"],
            tool_held_rows=report["tool_held_rows"],
            from_cache=str(entry.folder),
            train_turns=np.load(entry.folder / "train_turns.npy")
            if (entry.folder / "train_turns.npy").exists()
            else None,
        )
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as err:
        if console is not None:
            console.print(
                f"[yellow]note: the cached data at {entry.folder} is incomplete or damaged ({err}); "
                "preparing again[/yellow]"
            )
        shutil.rmtree(entry.folder, ignore_errors=True)
        return None
    os.utime(manifest_path)  # most recently used (entries beyond KEEP are removed oldest first)
    return prepared


def _image_column(names: list[str]) -> str | None:
    """The column of a prepared table that names its rows' pictures: SFT/DPO rows' image_sources, image GRPO's prompt
    images (beside its prompt_messages: a text run's own column called images is not pictures)."""
    if "image_sources" in names:
        return "image_sources"
    return "images" if "images" in names and "prompt_messages" in names else None


def _image_files(prepared) -> dict:
    """(size, mtime_ns) of every image file the prepared rows read (a vision-language run): the cache key holds the
    data files, not the pictures they name, so a cached entry is used only while these are unchanged."""
    import pyarrow.compute as pc

    from leap_finetune.data.messages import looks_base64

    columns = [_image_column(split.table.column_names) for split in (prepared.train, prepared.eval)]
    if not any(columns):
        return None  # (a text run)
    files = {}
    for split, column in zip((prepared.train, prepared.eval), columns, strict=True):
        if column is None:
            continue
        for source in pc.unique(pc.list_flatten(split.table.column(column))).to_pylist():
            if source and not source.startswith(("data:", "http://", "https://")) and not looks_base64(source):
                try:
                    stat = os.stat(source)
                    files[source] = [stat.st_size, stat.st_mtime_ns]
                except OSError:
                    files[source] = None
    return files


def _images_changed(report: dict) -> str | None:
    """What changed among the pictures of a cached entry (None: nothing). A row dropped for its image (missing,
    unreadable, too long) may be fixed since: an entry with such rows is prepared again too."""
    if report.get("image_files") is None:
        return None
    for source, known in report["image_files"].items():
        try:
            stat = os.stat(source)
            now = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            now = None
        if now != known:
            return f"the image {source} changed"
    for dropped in report.get("dropped", []):
        if "image" in dropped.get("reason", ""):
            return f"a row was dropped for its image ({dropped['file']}, {dropped['location']})"
    return None


def _read_split(folder: Path, name: str) -> RowTable:
    # Memory-mapped: the token ids are read from the page cache when used, not copied into this process.
    table = pa.ipc.open_file(pa.memory_map(str(folder / f"{name}.arrow"))).read_all()
    counts = np.load(folder / f"{name}_counts.npy")
    return RowTable(table, counts[0], counts[1])


def working_folder(entry: Entry | None) -> Path:
    """Where the data step writes the prepared rows as it goes: the entry's staging folder (renamed into
    place when complete), or a temporary folder when nothing is cached (removed at exit)."""
    if entry is not None:
        staging = entry.folder.with_name(f".{entry.folder.name}.{os.getpid()}.tmp")
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            return staging
        except OSError:
            pass  # an unwritable cache: prepare in a temporary folder (store() says why nothing is cached)
    import atexit
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="leap-finetune-prepared-"))
    atexit.register(shutil.rmtree, folder, True)  # (a memory-mapped file stays readable until unmapped)
    return folder


def store(entry: Entry, prepared, staging: Path, console) -> None:
    """Complete the entry the data step wrote into `staging` and rename it into place (never fails the
    run: a cache that cannot be written is reported and skipped)."""
    try:
        if staging.parent != entry.folder.parent:
            raise OSError(f"cannot create {entry.folder.parent}")
        for name, split in (("train", prepared.train), ("eval", prepared.eval)):
            if not (staging / f"{name}.arrow").exists():  # kept in memory (not spilled while preparing)
                with pa.OSFile(str(staging / f"{name}.arrow"), "wb") as sink:
                    with pa.ipc.new_file(sink, split.table.schema) as writer:
                        writer.write_table(split.table)
            np.save(staging / f"{name}_counts.npy", np.stack([split.tokens_per_row, split.trained_per_row]))
        if prepared.train_turns is not None:  # (benchmark rows that are training rows: evaluation/trained_rows.py)
            np.save(staging / "train_turns.npy", prepared.train_turns)
        report = {
            "rows_read": prepared.rows_read,
            "dropped": [d.to_json() for d in prepared.dropped],
            "invalid_skipped": prepared.invalid_skipped,
            "fully_truncated": prepared.fully_truncated,
            "partially_truncated": prepared.partially_truncated,
            "sample_messages": [
                {"messages": c.messages, "tools": c.tools, "images": [[r.source, r.field] for r in c.images]}
                for c in prepared.sample_messages
            ],
            "image_files": _image_files(prepared),
            "warnings": [w.__dict__ for w in prepared.warnings],
            "warning_rows": prepared.warning_rows,
            "notices": prepared.notices,
            "sources": [s.to_json() for s in prepared.sources],
            "tool_split": prepared.tool_split,
            "unseen_tool_rows": prepared.unseen_tool_rows,
            "tool_held_rows": prepared.tool_held_rows,
            "examples": prepared.train.examples,
            "fingerprints": [prepared.train.fingerprint(), prepared.eval.fingerprint()],
        }
        (staging / "report.json").write_text(json.dumps(report, default=str), encoding="utf-8")
        files = {p.name: [p.stat().st_size, _file_digest(p)] for p in sorted(staging.iterdir())}
        (staging / "manifest.json").write_text(
            json.dumps({"key": entry.key, "files": files, "created": time.time(), "seconds": prepared.seconds}),
            encoding="utf-8",
        )
        swap_in(staging, entry.folder)  # (another process may have written it meanwhile: swapped, not merged)
        _evict(entry.folder.parent)
    except BaseException as err:  # (Ctrl-C or a kill while hashing a large file included: no staging left)
        if staging.parent == entry.folder.parent:
            shutil.rmtree(staging, ignore_errors=True)
        if not isinstance(err, OSError):
            raise
        if console is not None:
            console.print(
                f"[yellow]note: the prepared data could not be cached in {entry.folder.parent} "
                f"({err.strerror or err}); set LEAP_FINETUNE_CACHE to a writable folder[/yellow]"
            )


def _evict(root: Path) -> None:
    for staging in root.glob(".*.tmp"):  # left by a process that was killed while preparing
        pid = staging.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)
    entries = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    entries.sort(
        key=lambda p: (p / "manifest.json").stat().st_mtime if (p / "manifest.json").exists() else 0, reverse=True
    )
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
