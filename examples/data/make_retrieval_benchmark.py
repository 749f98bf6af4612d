"""Writes retrieval_bench/ (the BEIR layout) from the retrieval example rows: every positive of
retrieval_train.jsonl and retrieval_held_out.jsonl is a document; the held-out queries are the queries, each
with its positive as the relevant document. Run: python examples/data/make_retrieval_benchmark.py"""

import json
from pathlib import Path

here = Path(__file__).parent
rows = {
    split: [json.loads(line) for line in (here / f"retrieval_{split}.jsonl").read_text().splitlines()]
    for split in ("train", "held_out")
}
documents = {}
for row in rows["train"] + rows["held_out"]:
    documents.setdefault(row["positive"], f"d{len(documents)}")
out = here / "retrieval_bench"
(out / "qrels").mkdir(parents=True, exist_ok=True)
(out / "corpus.jsonl").write_text(
    "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for t, i in documents.items())
)
(out / "queries.jsonl").write_text(
    "".join(json.dumps({"_id": f"q{n}", "text": r["query"]}) + "\n" for n, r in enumerate(rows["held_out"]))
)
(out / "qrels" / "test.tsv").write_text(
    "query-id\tcorpus-id\tscore\n"
    + "".join(f"q{n}\t{documents[r['positive']]}\t1\n" for n, r in enumerate(rows["held_out"]))
)
