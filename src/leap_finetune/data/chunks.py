"""The work done on each chunk of rows - check, then render + tokenize - in this process or in a pool
of forked processes (every core of the machine). A chunk's result is small: problems, counts and an
Arrow table, never the parsed rows.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.data.grpo_rows import category
from leap_finetune.data.held_out_tools import benchmark_rows, held_out_names, tools_named
from leap_finetune.data.images import ImageProblem, VisionRenderer, open_image
from leap_finetune.data.prepared import dataset_items
from leap_finetune.data.readers import SourceRow, parse_row
from leap_finetune.data.row_digests import trained_digest, turn_digests
from leap_finetune.data.row_kinds import contract, row_kind_of
from leap_finetune.data.sft_rows import Conversation, RowWarning
from leap_finetune.data.table import RowTable, columns_to_table
from leap_finetune.data.tool_call_score import reference_calls
from leap_finetune.errors import LeapError, RowProblem
from leap_finetune.methods import method_of

CHUNK_ROWS = 512


@dataclass
class Job:
    """What every chunk needs; forked workers inherit it (nothing is pickled)."""

    resolved: ResolvedConfig
    renderer: object  # a Renderer, or a RetrievalEncoder for embedding / colbert


_JOB: Job | None = None


def set_job(job: Job, parent: int | None = None) -> None:
    global _JOB
    _JOB = job
    if job is not None and os.environ.get("LEAP_FINETUNE_DATA_WORKER"):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process
    if parent is not None:  # a forked data worker: the driver decides what a signal does, and its death ends us
        import signal

        from leap_finetune.signals import die_with_parent

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C reaches the whole process group)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        die_with_parent(signal.SIGKILL, parent)  # measured before: a SIGKILLed driver left ~550 MB workers behind


def uses_reward(resolved: ResolvedConfig, name: str) -> bool:
    rewards = resolved.rewards
    return rewards is not None and any((f["name"] if isinstance(f, dict) else f) == name for f in rewards.funcs)


def matches_calls(resolved: ResolvedConfig) -> bool:
    """GRPO with the tool_call_match reward: each row's solution must be a turn it can read."""
    return uses_reward(resolved, "tool_call_match")


# built-in rewards that score a completion against the row's `solution` (a row without one: None, not scored)
BOX_REWARDS = ("iou", "giou", "ciou")  # (rl/grounding.py's SCORES: data/ does not import rl/)
SOLUTION_REWARDS = ("accuracy", "tool_call_match", *BOX_REWARDS)


def _only_solution_rewards(resolved: ResolvedConfig) -> list[str]:
    """The run's rewards when every one of them needs a solution (no judge, no custom or other built-in reward)."""
    rewards = resolved.rewards
    if rewards is None or getattr(rewards, "judge", None) is not None:
        return []
    names = [f["name"] if isinstance(f, dict) else f for f in rewards.funcs]
    return names if names and all(name in SOLUTION_REWARDS for name in names) else []


def _solution_problem(resolved: ResolvedConfig, parsed) -> str | None:
    """What the row's solution cannot be for the rewards that read it: missing where every reward needs it (the
    prompt would get no reward: TRL's warning at every step, and nothing trained), a turn tool_call_match cannot read,
    or for accuracy an answer with nothing left once normalised (an empty answer would match it)."""
    if not hasattr(parsed, "solution"):
        return None
    solution = parsed.solution
    if not solution or not str(solution).strip():
        needing = _only_solution_rewards(resolved)
        if not needing:
            return None
        return (
            f"the row has no solution, and every reward of this run ({', '.join(needing)}) scores a completion "
            "against it: this prompt would get no reward and train nothing; add the row's solution, remove the row, "
            "or add a reward that needs none (format, length, a judge)"
        )
    if matches_calls(resolved):
        _, why = reference_calls(solution)
        if why is not None:
            return f"tool_call_match cannot read it: {why}"
    boxes = [name for name in BOX_REWARDS if uses_reward(resolved, name)]
    if boxes:
        from leap_finetune.data.boxes import box_problem

        why = box_problem(solution)
        if why is not None:
            return f"reward {boxes[0]} scores the answer's boxes against it, and {why}"
    if uses_reward(resolved, "accuracy"):
        from leap_finetune.data.solutions import nothing_to_match

        return nothing_to_match(solution)
    return None


# ---- pass 1: check every row ---------------------------------------------------------------------------


@dataclass
class CheckedChunk:
    row_count: int
    valid: int
    problems: list[RowProblem] = field(default_factory=list)
    warnings: list[RowWarning] = field(default_factory=list)
    columns_seen: list[set] = field(default_factory=list)  # of the first 50 rows: another training type's data?
    extra_kinds: list[tuple[str, str, dict]] = field(default_factory=list)  # GRPO: (file, location, {column: kind})
    # rows whose images failed (decoding, length): pass 2's own check of the row does not open images, so it is
    # told to skip them (on_invalid: skip)
    image_invalid: list[tuple[str, str]] = field(default_factory=list)
    # dataset.hold_out_tools: (file, location, tools the row names) per valid row, and the benchmark rows of the
    # rows that name a held-out tool
    tool_rows: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    unseen_tool_rows: list[dict] = field(default_factory=list)


def check_chunk(rows: list[SourceRow]) -> CheckedChunk:
    resolved = _JOB.resolved
    check = contract(resolved)
    result = CheckedChunk(row_count=len(rows), valid=0)
    held_out = held_out_names(dataset_items(resolved))
    for row in rows:
        problem = parse_row(row)
        if problem:
            result.problems.append(problem)
            continue
        if len(result.columns_seen) < 50 and isinstance(row.data, dict):
            result.columns_seen.append(set(row.data))
        parsed, problems, warnings = check(row)
        result.warnings.extend(warnings)
        if not problems and getattr(parsed, "images", None):
            problems = check_images(row, parsed, _JOB.renderer)
            if problems:
                result.image_invalid.append((row.file, row.location))
        why = None if problems else _solution_problem(resolved, parsed)
        if why is not None:  # (pass 2's own check does not know the rewards: it is told to skip the row)
            problems = [RowProblem(row.file, row.location, "solution", why)]
            result.image_invalid.append((row.file, row.location))
        if problems:
            result.problems.extend(problems)
            continue
        result.valid += 1
        if held_out:
            names = tools_named(parsed)
            result.tool_rows.append((row.file, row.location, tuple(sorted(names))))
            if names & held_out:
                result.unseen_tool_rows.extend(benchmark_rows(parsed, row.file, row.location, held_out))
        if method_of(resolved).rewards:  # (the rewards read the extra columns: each has one kind across rows)
            result.extra_kinds.append(
                (row.file, row.location, {k: category(v) for k, v in parsed.extra.items() if v is not None})
            )
    return result


def check_images(row: SourceRow, parsed, renderer) -> list[RowProblem]:
    """Every image of the row decoded, and the row with its images' tokens within max_length (a
    VisionRenderer's reader counts them; without one - `plan` without the tokenizer - the files are opened)."""
    sizes = []
    for ref in parsed.images:
        try:
            sizes.append(
                renderer.reader.check(ref) if isinstance(renderer, VisionRenderer) else open_image(ref.source).size
            )
        except ImageProblem as err:
            return [RowProblem(row.file, row.location, ref.field, str(err))]
    if isinstance(renderer, VisionRenderer):
        try:
            too_long = renderer.fits(parsed, sizes)
        except ImageProblem as err:
            return [RowProblem(row.file, row.location, "messages", str(err))]
        if too_long:
            return [RowProblem(row.file, row.location, "messages", too_long)]
    return []


# ---- pass 2: tokenize the valid rows -------------------------------------------------------------------


@dataclass
class TokenizeRequest:
    rows: list[SourceRow]
    skip: frozenset = frozenset()  # (file, location) of rows pass 1 found valid but the chunk set rejected
    examples: frozenset = frozenset()  # positions among the chunk's valid rows to return in full
    samples: frozenset = frozenset()  # positions whose conversation to return
    expected: int = -1  # valid rows pass 1 counted in this chunk (the data step checks the count)
    disguise: frozenset = frozenset()  # dataset.augment_tools: positions of training rows that may be disguised
    disguise_share: float = 0.0


@dataclass
class TokenizedChunk:
    table: RowTable  # the kept rows (every trained token beyond max_length: not kept)
    kept: np.ndarray  # bool per valid row
    truncated_away: list[tuple[int, str, str, str]] = field(default_factory=list)  # (position, file, location, reason)
    partially_truncated: int = 0
    negatives: np.ndarray | None = None  # retrieval: hard negatives per kept row
    examples: dict = field(default_factory=dict)  # position -> full tokenized row
    samples: dict = field(default_factory=dict)  # position -> Conversation
    error: LeapError | None = None
    expected: int = -1
    # per valid row: a 64-bit digest of what it trains on (data/row_digests.py: eval rows that are training rows too)
    hashes: np.ndarray | None = None
    turns: list[list[int]] = field(default_factory=list)  # per valid row: its turns' digests (row_digests.turn_digests)
    disguised: int = 0  # dataset.augment_tools: rows shown disguised tools
    not_disguised: int = 0  # rows with tool calls but no definitions to disguise


def tokenize_chunk(request: TokenizeRequest) -> TokenizedChunk:
    resolved, renderer = _JOB.resolved, _JOB.renderer
    check = contract(resolved)
    retrieval = method_of(resolved).retrieval  # (each row's negatives are counted: every row needs as many)
    valid: list[tuple[SourceRow, object]] = []
    for row in request.rows:
        if parse_row(row) is not None or (row.file, row.location) in request.skip:
            continue
        parsed, problems, _ = check(row)
        if not problems:
            valid.append((row, parsed))
    result = TokenizedChunk(table=RowTable.empty(), kept=np.zeros(len(valid), dtype=bool), expected=request.expected)
    kind = row_kind_of(resolved)
    # (before augment_tools disguises a training row: its copy among the evaluation rows is the same row)
    result.hashes = np.fromiter((trained_digest(parsed) for _, parsed in valid), dtype=np.uint64, count=len(valid))
    result.turns = [turn_digests(kind.conversation(parsed)) for _, parsed in valid]
    if request.disguise:
        valid = _disguised(valid, request, result, resolved.training.get("seed", 42))
    try:
        if kind.tokenize_batch is not None:  # (the rows of `inspect` tokenized again, in full)
            compact = kind.tokenize_batch(renderer, [parsed for _, parsed in valid])
        else:
            compact = [kind.tokenize(renderer, parsed) for _, parsed in valid]
        for position in request.examples:
            source, parsed = valid[position]
            full = kind.tokenize(renderer, parsed) if kind.tokenize_batch is not None else compact[position]
            full.meta.update(file=source.file, location=source.location)
            result.examples[position] = full
    except LeapError as err:  # raised by the data step in order, after the problems of every row
        result.error = err
        return result
    for position in request.samples:
        if isinstance(valid[position][1], Conversation):
            result.samples[position] = valid[position][1]
    columns, tokens, trained, negatives = [], [], [], []
    for position, ((source, _), row) in enumerate(zip(valid, compact, strict=True)):
        if row.trained_tokens == 0:
            result.truncated_away.append(
                (
                    position,
                    source.file,
                    source.location,
                    f"every trained token is beyond max_length={renderer.max_length} ({row.tokens} tokens)",
                )
            )
            continue
        result.kept[position] = True
        lost = getattr(row, "trained_tokens_lost", None)
        result.partially_truncated += bool(lost) if lost is not None else bool(row.truncated)
        columns.append(_columns(row))
        tokens.append(row.tokens)
        trained.append(row.trained_tokens)
        if retrieval:
            negatives.append(len(row.negatives))
    result.table = RowTable(
        columns_to_table(columns), np.asarray(tokens, dtype=np.int64), np.asarray(trained, dtype=np.int64)
    )
    if retrieval:
        result.negatives = np.asarray(negatives, dtype=np.int64)
    return result


def _disguised(valid: list, request: TokenizeRequest, result: TokenizedChunk, seed) -> list:
    """dataset.augment_tools: the chosen training rows with their tools disguised (data/tool_disguise.py). Each row's
    choice and disguise come from the seed and the row itself, so a prepared set is the same on every run."""
    import random

    from leap_finetune.data.tool_calls import CALL_START
    from leap_finetune.data.tool_disguise import disguise_conversation

    out = list(valid)
    for position in request.disguise:
        row, parsed = valid[position]
        rng = random.Random(f"{seed}:{int(result.hashes[position])}")
        if rng.random() >= request.disguise_share:
            continue
        shown = disguise_conversation(parsed, rng)
        if shown is not None:
            out[position] = (row, shown)
            result.disguised += 1
        elif any(m["role"] == "assistant" and CALL_START in str(m.get("content")) for m in parsed.messages):
            result.not_disguised += 1
    return out


def _columns(row) -> dict:
    """The trainer's columns, token ids as NumPy (stored as list<int32> without a loop over tokens)."""
    columns = row.columns()
    return {
        k: np.asarray(v, dtype=np.int32) if k.endswith("_ids") and isinstance(v, list) else v
        for k, v in columns.items()
    }


# ---- running chunks ------------------------------------------------------------------------------------


def chunked(rows: Iterable[SourceRow], size: int = CHUNK_ROWS) -> Iterator[list[SourceRow]]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def processes_for(requested: int | None, rows_estimate: int) -> int:
    """Every core for data worth it (a forked process costs ~0.1 s), or what dataset.num_proc says. Workers are
    forked, which is safe on Linux only (macOS's system libraries are not fork-safe): one process elsewhere."""
    if sys.platform != "linux":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if requested is not None:
        return min(requested, cores)  # (more processes than cores only add memory)
    return max(1, min(cores, rows_estimate // 2000))


class Workers:
    """Chunks of work in this process (processes=1) or in a pool of forked processes, results in order,
    with at most two chunks per process in flight (so reading never runs ahead of the work). A worker that
    dies (the out-of-memory killer) is an error that says so, not a wait forever (concurrent.futures raises
    BrokenProcessPool where multiprocessing.Pool would hang)."""

    def __init__(self, job: Job, processes: int):
        self.processes = processes
        self.pool = None
        set_job(job)
        if processes > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # fork: the workers inherit the tokenizer and template (nothing to pickle or load again).
            # The tokenizer's own threads are off in them (one core each; see set_job).
            saved = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            os.environ["LEAP_FINETUNE_DATA_WORKER"] = "1"
            try:
                self.pool = ProcessPoolExecutor(
                    processes,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=set_job,
                    initargs=(job, os.getpid()),
                )
                self.pool.submit(int).result()  # the workers are forked now, with the environment above
            finally:
                os.environ.pop("LEAP_FINETUNE_DATA_WORKER", None)
                if saved is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = saved

    def map(self, function: Callable, items: Iterable) -> Iterator:
        if self.pool is None:
            for item in items:
                yield function(item)
            return
        from concurrent.futures.process import BrokenProcessPool

        pending: deque = deque()
        try:
            for item in items:
                pending.append(self.pool.submit(function, item))
                if len(pending) >= 2 * self.processes:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise LeapError(
                "a data worker process died (often the system running out of memory)",
                where="dataset",
                fix="set dataset.num_proc lower (each process holds a chunk of rows and the tokenizer), or free memory",
            ) from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        set_job(None)
