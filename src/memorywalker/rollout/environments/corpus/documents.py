"""A fixed document corpus and its queries (BrowseComp-Plus layout): loading, BM25 search, grading.

Two files, JSON Lines (``.jsonl``, ``.jsonl.gz``) or Parquet (``.parquet``, needs ``pyarrow``):

* **documents** — one per line: a document id, its text, optionally a title and a URL;
* **queries** — one per line: a query id, the question, the gold answer (a string, or a list of
  accepted strings) and the ids of the gold evidence documents (a list of ids, or of objects with an
  id, as BrowseComp-Plus's ``evidence_docs`` are).

Field names are looked up in :data:`DOC_FIELDS` / :data:`QUERY_FIELDS` (first name present wins;
two names present with different values is an error), so BrowseComp-Plus's released files
(``docid``/``text``/``url``; ``query_id``/``query``/``answer``/``evidence_docs``), Pyserini's
(``id``/``contents``) and BEIR's (``_id``/``title``/``text``) load as they are.

Every bad line is an error naming the file, the line and the cause (:class:`CorpusError`, an
``InputError``): text that is not JSON, a missing or non-string id or text, a duplicate id, an evidence
id that is not in the corpus. Nothing is skipped silently; a blank line is not a record.

Grading (:func:`grade`), with ``E`` the query's evidence ids, ``O`` the documents the agent opened and
``w = answer_weight``::

    exact_match     = 1 if normalize(answer) equals normalize(g) for some gold answer g, else 0
    evidence_recall = |O ∩ E| / |E|
    reward          = w · exact_match + (1 − w) · evidence_recall        (reward = exact_match if E is empty)

``retrieval_recall = |(O ∪ R) ∩ E| / |E|``, ``R`` the ids any search returned, is BrowseComp-Plus's
"Recall" (evidence documents the retriever ever surfaced); it is reported, not rewarded.

>>> g = grade("tobias wren.", ["Tobias Wren"], opened={"104", "110"}, retrieved={"103"}, evidence=["103", "104"])
>>> g.exact_match, g.evidence_recall, g.retrieval_recall, g.reward
(1.0, 0.5, 1.0, 0.75)
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from memorywalker import fileio
from memorywalker.errors import InputError
from memorywalker.rollout.environments.base import exact_match
from memorywalker.rollout.environments.bm25 import bm25_index, bm25_top

# canonical field -> accepted names, in order of preference
DOC_FIELDS: dict[str, tuple[str, ...]] = {
    "docid": ("docid", "doc_id", "id", "_id"),
    "text": ("text", "contents", "content", "body"),
    "title": ("title",),
    "url": ("url",),
}
QUERY_FIELDS: dict[str, tuple[str, ...]] = {
    "query_id": ("query_id", "qid", "id", "_id"),
    "query": ("query", "question"),
    "answer": ("answer", "answers", "gold_answer"),
    "evidence": ("evidence_docs", "evidence_docids", "evidence_ids", "evidence"),
}
INDEX_PROGRESS_DOCS = 10_000  # corpora this large show bm25s's progress bars while indexing
INDEX_FORMAT = 1  # of a cached index: what was indexed (title + text, English stopwords) and how
STAMP = "memorywalker-index.json"
# Observations that did not serve the request (an error, or an injected stale-cache fault): neither the
# grading of a record nor the expert counts them.
FAILED = ("Error", "Warning: served from a stale cache")


class CorpusError(InputError):
    """A bad documents or queries file: ``FILE: line N: cause``."""


@dataclass(frozen=True)
class Document:
    docid: str
    text: str
    title: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class Query:
    query_id: str
    question: str
    answers: tuple[str, ...]  # accepted gold answers (the first is the task's answer)
    evidence: tuple[str, ...]  # gold evidence document ids, in file order, without repeats


@dataclass(frozen=True)
class Grade:
    exact_match: float
    evidence_recall: float | None  # None when the query has no evidence ids
    retrieval_recall: float | None
    reward: float


def grade(answer: str, answers: list[str] | tuple[str, ...], *, opened: set[str], retrieved: set[str],
          evidence: list[str] | tuple[str, ...], answer_weight: float = 0.5) -> Grade:
    """Grade one episode (the equations are in the module docstring)."""
    em = max((exact_match(answer, g) for g in answers), default=0.0)
    gold = set(evidence)
    if not gold:
        return Grade(em, None, None, em)
    recall = len(opened & gold) / len(gold)
    seen = len((opened | retrieved) & gold) / len(gold)
    return Grade(em, recall, seen, answer_weight * em + (1 - answer_weight) * recall)


# --- reading --------------------------------------------------------------------------------------

def file_sha256(path: str | os.PathLike) -> str:
    """The first 16 hex digits of the file's SHA-256 (what a record pins the file by)."""
    return fileio.file_sha256(path)[:16]


def iter_rows(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for every record of a JSONL (``line N``) or Parquet (``row N``) file."""
    p = Path(path)
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # lazy: optional dependency (pyarrow, the parquet extra)
        except ImportError:
            raise CorpusError(f"{p}: reading Parquet needs pyarrow (pip install pyarrow), or convert the "
                              "file to JSONL (docs/rollouts.md, corpus section)") from None
        n = 0
        for batch in pq.ParquetFile(p).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                n += 1
                yield f"row {n}", row
        return
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.rstrip(b"\r\n"))  # one line: error columns count within it
            except (ValueError, UnicodeDecodeError) as e:
                cause = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
                raise CorpusError(f"{p}: line {n}: not valid JSON ({cause})") from None
            yield f"line {n}", row


def _field(row: dict[str, Any], names: tuple[str, ...], what: str, where: str) -> Any:
    """The value of the first of ``names`` present in ``row`` (None if none is)."""
    present = [(k, row[k]) for k in names if row.get(k) is not None]
    if len({json.dumps(v, sort_keys=True, default=str) for _, v in present}) > 1:
        raise CorpusError(f"{where}: fields {', '.join(repr(k) for k, _ in present)} both give the {what} "
                          "and differ")
    return present[0][1] if present else None


def _id(value: Any, what: str, where: str, names: tuple[str, ...]) -> str:
    if value is None:
        raise CorpusError(f"{where}: no {what} (a field named {' or '.join(names)})")
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value).strip() == "":
        raise CorpusError(f"{where}: the {what} must be a non-empty string, got {json.dumps(value, default=str)}")
    return str(value)


def _optional_str(value: Any, what: str, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise CorpusError(f"{where}: the {what} must be a string, got {type(value).__name__}")
    return value


def _object(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: a JSON object expected, got {type(row).__name__}")
    return row


def _rows(path: str | os.PathLike, id_names: tuple[str, ...], what: str) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(``FILE: line N``, the line's object, its id) for each line of ``path`` (the id under one of ``id_names``)."""
    for where, row in iter_rows(path):
        where = f"{path}: {where}"
        row = _object(row, where)
        yield where, row, _id(_field(row, id_names, f"{what} id", where), f"{what} id", where, id_names)


def _first(first: dict[str, str], rid: str, what: str, where: str) -> None:
    """Record where id ``rid`` first stood; a second time is an error naming both lines."""
    if rid in first:
        raise CorpusError(f"{where}: duplicate {what} id {rid!r} (first at {first[rid]})")
    first[rid] = where.rsplit(": ", 1)[-1]


def read_documents(path: str | os.PathLike) -> list[Document]:
    """The documents of ``path``, in file order (:class:`CorpusError` on the first bad line)."""
    docs: list[Document] = []
    first: dict[str, str] = {}
    for where, row, docid in _rows(path, DOC_FIELDS["docid"], "document"):
        text = _field(row, DOC_FIELDS["text"], "text", where)
        if not isinstance(text, str):
            raise CorpusError(f"{where}: document {docid!r} has no text (a string field named "
                              f"{' or '.join(DOC_FIELDS['text'])})")
        _first(first, docid, "document", where)
        docs.append(Document(docid, text, _optional_str(_field(row, DOC_FIELDS["title"], "title", where), "title", where),
                             _optional_str(_field(row, DOC_FIELDS["url"], "url", where), "url", where)))
    if not docs:
        raise CorpusError(f"{path}: no documents")
    return docs


def _evidence_ids(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CorpusError(f"{where}: the evidence must be a list of document ids, got {type(value).__name__}")
    out: list[str] = []
    for item in value:
        if isinstance(item, dict):  # BrowseComp-Plus: {"docid": ..., "text": ...}
            item = _field(item, DOC_FIELDS["docid"], "evidence document id", where)
        docid = _id(item, "evidence document id", where, DOC_FIELDS["docid"])
        if docid not in out:
            out.append(docid)
    return out


def _answers(value: Any, where: str) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    ok = [str(v) for v in values if (isinstance(v, str) and v.strip()) or (isinstance(v, int) and not isinstance(v, bool))]
    if value is None or not values or len(ok) != len(values):
        raise CorpusError(f"{where}: the answer must be a non-empty string or a list of them "
                          f"(a field named {' or '.join(QUERY_FIELDS['answer'])}), got {json.dumps(value, default=str)}")
    return tuple(ok)  # an integer answer (1838) is its decimal string


def read_queries(path: str | os.PathLike, documents: dict[str, Document], *, corpus_name: str = "the corpus") -> list[Query]:
    """The queries of ``path``; every evidence id must name one of ``documents``."""
    queries: list[Query] = []
    first: dict[str, str] = {}
    for where, row, qid in _rows(path, QUERY_FIELDS["query_id"], "query"):
        question = _field(row, QUERY_FIELDS["query"], "question", where)
        if not isinstance(question, str) or not question.strip():
            raise CorpusError(f"{where}: query {qid!r} has no question (a string field named "
                              f"{' or '.join(QUERY_FIELDS['query'])})")
        answers = _answers(_field(row, QUERY_FIELDS["answer"], "answer", where), where)
        evidence = _evidence_ids(_field(row, QUERY_FIELDS["evidence"], "evidence", where), where)
        missing = [d for d in evidence if d not in documents]
        if missing:
            raise CorpusError(f"{where}: evidence document {missing[0]!r} of query {qid!r} is not in {corpus_name}"
                              + (f" ({len(missing)} of its {len(evidence)} evidence ids are not)" if len(missing) > 1 else ""))
        _first(first, qid, "query", where)
        queries.append(Query(qid, question, answers, tuple(evidence)))
    if not queries:
        raise CorpusError(f"{path}: no queries")
    return queries


def tiny_corpus() -> tuple[Path, Path]:
    """(documents, queries) of the shipped tiny corpus: 36 short documents about an invented coast and
    8 multi-hop queries with 1-3 evidence documents each, written for memorywalker's tests (its licence
    is the project's, Apache-2.0)."""
    root = resources.files("memorywalker.data").joinpath("tiny-corpus")
    return Path(str(root.joinpath("docs.jsonl"))), Path(str(root.joinpath("queries.jsonl")))


# --- search -----------------------------------------------------------------------------------------

class Corpus:
    """Documents by id and a BM25 index over ``title + text`` (``bm25s``, Lucene scoring, English stopwords).

    >>> c = Corpus([Document("a", "red apples and pears"), Document("b", "green pears"), Document("c", "blue sky")])
    >>> [(d.docid, round(s, 3)) for d, s in c.search("pears apples")]
    [('a', 0.514), ('b', 0.201)]

    (Lucene BM25, k1 = 1.5, b = 0.75: idf(t) = ln(1 + (N − df + 0.5) / (df + 0.5)), a term's weight in a
    document tf / (tf + k1 · (1 − b + b · dl / avgdl)); "and" is a stopword, so dl = 3, 2, 2 and
    avgdl = 7/3: a = (ln 1.6 + ln(8/3)) / (1 + 1.8214) = 0.514, b = ln 1.6 / (1 + 1.3393) = 0.201.)
    """

    def __init__(self, documents: list[Document], *, index_cache: str | os.PathLike | None = None, key: str = ""):
        # index_cache: a directory where the index is saved once and loaded (memory-mapped) after, under
        # a subdirectory named by ``key`` (the corpus file's sha256: another file never reads it).
        if index_cache is not None and not key:
            raise ValueError("an index cache needs the key of the documents (e.g. their file's sha256)")
        self.documents = documents
        self.by_id = {d.docid: d for d in documents}
        self.index_cache, self.key = index_cache, key

    def __len__(self) -> int:
        return len(self.documents)

    def get(self, docid: str) -> Document | None:
        return self.by_id.get(docid)

    @cached_property
    def _index(self):
        import bm25s  # lazy: bm25s (~150 ms) off the CLI's start path

        progress = len(self.documents) >= INDEX_PROGRESS_DOCS
        stamp = {"format": INDEX_FORMAT, "bm25s": bm25s.__version__, "key": self.key, "documents": len(self.documents)}
        where = Path(self.index_cache) / f"bm25-{self.key}" if self.index_cache is not None else None
        if where is not None and _read_stamp(where / STAMP) == stamp:
            return bm25s.BM25.load(where, mmap=True, show_progress=False)
        retriever = bm25_index([f"{d.title}\n{d.text}" if d.title else d.text for d in self.documents],
                               progress=progress)
        if where is not None:  # written aside and renamed: a concurrent run or a kill never leaves half an index
            tmp = where.with_name(f"{where.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            retriever.save(tmp, show_progress=False)
            (tmp / STAMP).write_text(json.dumps(stamp))
            shutil.rmtree(where, ignore_errors=True)  # a stale index of another bm25s version
            try:
                tmp.rename(where)
            except OSError:  # another process saved it first
                shutil.rmtree(tmp, ignore_errors=True)
        return retriever

    def search(self, query: str, k: int = 5) -> list[tuple[Document, float]]:
        """The top-``k`` documents for ``query`` with their BM25 scores (ties broken by file order;
        documents sharing no term with the query are not returned)."""
        return [(self.documents[i], s) for i, s in bm25_top(self._index, query, k, len(self.documents))]


def _read_stamp(path: Path) -> dict | None:
    """The stamp of a cached index; None when there is none or it cannot be read (then it is rebuilt)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def text_parts(text: str, size: int) -> list[str]:
    """``text`` in parts of at most ``size`` characters, cut at the last whitespace of a part's second
    half where there is one (so words stay whole).

    >>> text_parts("one two three four", 9)
    ['one two ', 'three ', 'four']
    >>> text_parts("", 9)
    ['']
    """
    parts, start = [], 0
    while len(text) - start > size:
        end = start + size
        cut = max(text.rfind(" ", start + size // 2, end), text.rfind("\n", start + size // 2, end))
        end = cut + 1 if cut >= 0 else end
        parts.append(text[start:end])
        start = end
    parts.append(text[start:])
    return parts
