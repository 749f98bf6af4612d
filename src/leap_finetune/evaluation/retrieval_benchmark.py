"""Retrieval benchmarks (`metric: retrieval`) for embedding and ColBERT models: a folder in the BEIR layout -
the queries, a corpus, and which documents are relevant to each query - scored with nDCG@10, MRR@10 and
recall@k by sentence-transformers' retrieval evaluators, during training and by `leap-finetune eval`.

    FOLDER/corpus.jsonl    {"_id": "d1", "text": "...", "title": "..."}   (`id` also accepted; title optional)
    FOLDER/queries.jsonl   {"_id": "q1", "text": "..."}                   (optionally "relevant": ["d1", ...])
    FOLDER/qrels/test.tsv  query-id <TAB> corpus-id <TAB> score           (BEIR's header line; score > 0 counts)

Every row is checked (file, line, field) before a model loads; relevance can come from qrels or from the
queries' `relevant` lists.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.errors import DataError, LeapError, RowProblem

FILES = "corpus.jsonl, queries.jsonl and qrels/test.tsv (or `relevant` lists in the queries)"


@dataclass
class RetrievalBenchmark:
    name: str
    queries: dict[str, str]
    corpus: dict[str, str]
    relevant: dict[str, set[str]] = field(default_factory=dict)

    @property
    def scored_queries(self) -> int:
        return sum(1 for q in self.queries if self.relevant.get(q))


def load_retrieval_benchmark(bench) -> RetrievalBenchmark:
    """Every row of the folder, or a DataError listing every problem."""
    from leap_finetune.data.readers import read_dataset

    folder = Path(bench.path)
    key = f"evals.benchmarks ('{bench.name}') path"
    if not folder.is_dir() or not (folder / "corpus.jsonl").is_file() or not (folder / "queries.jsonl").is_file():
        raise LeapError(
            f"a retrieval benchmark is a folder with {FILES}",
            where=f"{key}: {folder}",
            fix="point path at such a folder (the BEIR layout)",
        )
    problems: list[RowProblem] = []
    corpus: dict[str, str] = {}
    result = read_dataset(str(folder / "corpus.jsonl"), key=key)
    problems += result.problems
    for row in result.rows:
        doc_id = _id(row, problems)
        title = row.data.get("title") if isinstance(row.data, dict) else None
        if title is not None and not isinstance(title, str):
            problems.append(RowProblem(row.file, row.location, "title", f"expected text, got {type(title).__name__}"))
            title = None
        has_title = isinstance(title, str) and bool(title.strip())
        # (BEIR corpora have documents with a title and an empty text)
        text = row.data.get("text") if has_title and isinstance(row.data, dict) else None
        text = text if isinstance(text, str) else _text(row, "text", problems)
        if doc_id is None or text is None:
            continue
        if doc_id in corpus:
            problems.append(RowProblem(row.file, row.location, "_id", f"'{doc_id}' is used by another document"))
        corpus[doc_id] = f"{title} {text}".strip() if has_title else text
    queries: dict[str, str] = {}
    relevant: dict[str, set[str]] = {}
    result = read_dataset(str(folder / "queries.jsonl"), limit=bench.limit, key=key)
    problems += result.problems
    for row in result.rows:
        query_id = _id(row, problems)
        text = _text(row, "text", problems)
        if query_id is None or text is None:
            continue
        if query_id in queries:
            problems.append(RowProblem(row.file, row.location, "_id", f"'{query_id}' is used by another query"))
        queries[query_id] = text
        listed = row.data.get("relevant")
        if listed is not None:
            if not isinstance(listed, list) or not all(isinstance(x, (str, int)) for x in listed):
                problems.append(RowProblem(row.file, row.location, "relevant", "expected a list of document ids"))
                continue
            for doc_id in map(str, listed):
                if doc_id not in corpus:
                    problems.append(
                        RowProblem(row.file, row.location, "relevant", f"'{doc_id}' is not a document of corpus.jsonl")
                    )
                relevant.setdefault(query_id, set()).add(doc_id)
    qrels = _qrels_file(folder)
    if qrels is not None:
        _read_qrels(qrels, queries, corpus, relevant, problems, limited=bench.limit is not None)
    if problems:
        raise DataError(
            problems=problems,
            total_rows=len(queries) + len(corpus),
            title=f"benchmark '{bench.name}'",
            fix_text="correct the rows listed above (every query and document is used)",
        )
    benchmark = RetrievalBenchmark(bench.name, queries, corpus, relevant)
    if benchmark.scored_queries == 0:
        raise LeapError(
            f"benchmark '{bench.name}': no query has a relevant document",
            where=f"{key}: {folder}",
            fix="add qrels/test.tsv (query-id, corpus-id, score) or `relevant` lists to queries.jsonl",
        )
    return benchmark


def _qrels_file(folder: Path) -> Path | None:
    qrels = folder / "qrels"
    if (qrels / "test.tsv").is_file():
        return qrels / "test.tsv"
    found = sorted(qrels.glob("*.tsv")) if qrels.is_dir() else []
    return found[0] if len(found) == 1 else None


def _read_qrels(path: Path, queries, corpus, relevant, problems, *, limited: bool) -> None:
    with path.open(encoding="utf-8", newline="") as handle:
        for number, fields in enumerate(csv.reader(handle, delimiter="\t"), start=1):
            if (number == 1 and fields[:2] == ["query-id", "corpus-id"]) or not any(f.strip() for f in fields):
                continue
            where = f"line {number}"
            if len(fields) < 2:
                problems.append(
                    RowProblem(str(path), where, "<line>", "expected query-id, corpus-id and score, separated by tabs")
                )
                continue
            query_id, doc_id = fields[0], fields[1]
            try:
                score = float(fields[2]) if len(fields) > 2 else 1.0
            except ValueError:
                problems.append(RowProblem(str(path), where, "score", f"expected a number, got {fields[2]!r}"))
                continue
            if query_id not in queries:
                if not limited:  # with `limit`, the other queries' judgements are simply not used
                    problems.append(
                        RowProblem(str(path), where, "query-id", f"'{query_id}' is not a query of queries.jsonl")
                    )
                continue
            if doc_id not in corpus:
                problems.append(
                    RowProblem(str(path), where, "corpus-id", f"'{doc_id}' is not a document of corpus.jsonl")
                )
                continue
            if score > 0:
                relevant.setdefault(query_id, set()).add(doc_id)


def _id(row, problems) -> str | None:
    data = row.data
    if not isinstance(data, dict):
        problems.append(RowProblem(row.file, row.location, "<row>", "expected an object with _id and text"))
        return None
    value = data.get("_id", data.get("id"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 1.0 from a JSON writer that wrote numbers as floats
    if value is None or isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        problems.append(
            RowProblem(row.file, row.location, "_id", "missing or empty (a text or number id; `id` is also accepted)")
        )
        return None
    return str(value)


def _text(row, key: str, problems) -> str | None:
    if not isinstance(row.data, dict):
        return None
    value = row.data.get(key)
    if not isinstance(value, str) or not value.strip():
        problems.append(RowProblem(row.file, row.location, key, "missing or empty (expected text)"))
        return None
    return value


def evaluator(benchmark: RetrievalBenchmark, prompts, *, multi_vector: bool, name: str | None = None):
    """sentence-transformers' retrieval evaluator over the benchmark (metrics eval_<name>_<score>_ndcg@10, ...)."""
    return ir_evaluator(
        name or f"benchmark_{benchmark.name}",
        benchmark.queries,
        benchmark.corpus,
        benchmark.relevant,
        prompts,
        multi_vector=multi_vector,
    )


def ir_evaluator(name: str, queries: dict, corpus: dict, relevant: dict, prompts, *, multi_vector: bool):
    kwargs = dict(
        name=name,
        mrr_at_k=[10],
        ndcg_at_k=[10],
        accuracy_at_k=[1, 10],
        precision_recall_at_k=[1, 10],
        map_at_k=[10],
        query_prompt=prompts.query if prompts else None,
        corpus_prompt=prompts.document if prompts else None,
        write_csv=False,
    )
    if multi_vector:
        from sentence_transformers.multi_vector_encoder.evaluation import MultiVectorInformationRetrievalEvaluator

        return MultiVectorInformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    return InformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)


def scores(metrics: dict, name: str) -> dict[str, float]:
    """nDCG@10, MRR@10, recall@1/@10 out of an evaluator's metrics (`[eval_]<name>_<score function>_<metric>`,
    whatever the score function is called - cosine, maxsim, dot; never another benchmark whose name starts
    with this one's)."""
    import re

    pattern = re.compile(rf"^(?:eval_)?{re.escape(name)}_([a-z]+)_(ndcg@10|mrr@10|recall@1|recall@10)$")
    found = {}
    for key, value in metrics.items():
        match = pattern.match(key)
        if match:
            found[match.group(2)] = float(value)
    return found
