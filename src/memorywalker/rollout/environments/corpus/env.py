"""``corpus``: search / open / answer over a fixed local document corpus (BrowseComp-Plus style).

    memorywalker rollout --env corpus --corpus docs.jsonl --queries queries.jsonl --compressor claude-code -o r.jsonl

Without ``--corpus``/``--queries`` it runs on the shipped tiny corpus
(:func:`~memorywalker.rollout.environments.corpus.documents.tiny_corpus`). The file formats, the field mapping and the
grading are in :mod:`memorywalker.rollout.environments.corpus.documents`; docs/rollouts.md says how to point it at the real
BrowseComp-Plus files.

Tools: ``search(query)`` — the top ``search_k`` documents by BM25, each as ``N. [docid] title: snippet``;
``open(docid, part=1)`` — the document, in parts of ``open_chars`` characters; ``answer(text)`` —
ends the episode, reward by :func:`~memorywalker.rollout.environments.corpus.documents.grade` over the documents this
episode opened. One suite, ``all``: task ``i`` is the ``i``-th query of the file, its id the query id.

>>> env = CorpusEnv()
>>> task = env.task("all", 0)
>>> _ = env.reset(task)
>>> obs = env.step("search", {"query": "glassblower festival"}).observation
>>> [line.split("]")[0] + "]" for line in obs.splitlines()[1:]]
['1. [103]', '2. [104]', '3. [120]', '4. [105]', '5. [101]']
>>> env.step("open", {"docid": "104"}).observation.splitlines()[:2]
['[104] Ilse Marrow', 'https://haldmere.example/wiki/ilse-marrow']
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task, ToolSchema, Trajectory
from memorywalker.render.toolcalls import call_arguments
from memorywalker.rollout.environments.base import Environment, StepResult, split_of, tool
from memorywalker.rollout.environments.corpus.documents import (
    FAILED,
    Corpus,
    Grade,
    file_sha256,
    grade,
    read_documents,
    read_queries,
    text_parts,
    tiny_corpus,
)
from memorywalker.rollout.environments.corpus.expert import CorpusExpert

SYSTEM_PROMPT = (
    "You are a research assistant. Answer the question from a fixed collection of documents: search it, "
    "open documents by their docid (long documents come in parts), then answer. Before each tool call, "
    "write short notes of what you have learned, one per line as '- Entity | attribute: value'. "
    "Call answer with the exact answer only."
)

TOOLS = [
    tool("search", "Search the documents. Returns docids, titles and snippets.", {"query": "string"}),
    tool("open", "Open a document by its docid; part 2, 3, ... continue a long one.", {"docid": "string"},
         {"part": "integer"}),
    tool("answer", "Give the final answer. Ends the episode.", {"text": "string"}),
]
RESULT_RE = re.compile(r"^\d+\. \[([^\]]*)\]", re.M)  # a search result line's docid


class CorpusEnv(Environment):
    name = "corpus"
    system_prompt = SYSTEM_PROMPT
    suites = ("all",)

    def __init__(self, corpus: str | Path | None = None, queries: str | Path | None = None, *, world_seed: int = 0,
                 search_k: int = 5, snippet_chars: int = 120, open_chars: int = 2000, answer_weight: float = 0.5,
                 corpus_sha256: str | None = None, queries_sha256: str | None = None,
                 index_cache: str | Path | None = None):
        # world_seed: seeds the train/valid/test split of the queries (a hash of it and the query id).
        # index_cache: keep the BM25 index in this directory and reuse it (it changes no result, so it is
        # not part of config()).
        # corpus_sha256 / queries_sha256: when given (a recorded config), the files must still be those.
        if (corpus is None) != (queries is None):
            raise InputError("a corpus and its queries go together (--corpus with --queries), or neither "
                             "for the shipped tiny corpus")
        if not 0 <= answer_weight <= 1:
            raise InputError(f"answer_weight={answer_weight}: a weight in [0, 1]")
        if search_k < 1 or snippet_chars < 0 or open_chars < 1:
            raise InputError(f"search_k={search_k}, snippet_chars={snippet_chars}, open_chars={open_chars}: "
                             "search_k and open_chars must be >= 1, snippet_chars >= 0")
        self.corpus_arg, self.queries_arg = (None, None) if corpus is None else (str(corpus), str(queries))
        docs_path, queries_path = tiny_corpus() if corpus is None else (Path(corpus), Path(queries))
        self.sha256 = {"corpus": file_sha256(docs_path), "queries": file_sha256(queries_path)}
        for what, pinned in (("corpus", corpus_sha256), ("queries", queries_sha256)):
            if pinned is not None and pinned != self.sha256[what]:
                path = docs_path if what == "corpus" else queries_path
                raise InputError(f"{path}: not the file the records were made with "
                                 f"(sha256 {self.sha256[what]}, recorded {pinned})")
        self.corpus = Corpus(read_documents(docs_path), index_cache=index_cache, key=self.sha256["corpus"])
        self.queries = read_queries(queries_path, self.corpus.by_id, corpus_name=str(docs_path))
        self.queries_path = queries_path
        self.world_seed, self.search_k, self.snippet_chars = world_seed, search_k, snippet_chars
        self.open_chars, self.answer_weight = open_chars, answer_weight
        self._task: Task | None = None
        self._opened: set[str] = set()
        self._retrieved: set[str] = set()

    def tools(self) -> list[ToolSchema]:
        return list(TOOLS)

    def task(self, suite: str, index: int) -> Task:
        if suite not in self.suites:
            raise InputError(f"unknown suite {suite!r} of env corpus; valid: {', '.join(self.suites)}")
        if not 0 <= index < len(self.queries):
            raise InputError(f"{self.queries_path} holds {len(self.queries)} queries: there is no query "
                             f"number {index + 1} (ask for fewer with --n, or another --split)")
        q = self.queries[index]
        return Task(id=q.query_id, group=f"corpus:{q.query_id}", split=split_of(f"{self.world_seed}:{q.query_id}"),
                    suite=suite, answer=q.answers[0],
                    meta={"question": q.question, "answers": list(q.answers), "evidence": list(q.evidence),
                          "index": index})

    def reset(self, task: Task) -> str:
        self._task = task
        self._opened, self._retrieved = set(), set()
        return task.meta["question"]

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if self._task is None:
            return StepResult("Error: no episode is running (reset first).")
        arg = {"search": "query", "open": "docid", "answer": "text"}.get(name)
        if arg is None:
            return StepResult(f"Error: unknown tool {name!r}. Valid tools: search, open, answer.")
        value = arguments.get(arg) if isinstance(arguments, dict) else None
        if not isinstance(value, str | int) or isinstance(value, bool):
            return StepResult(f"Error: {name} needs a string argument {arg!r}.")
        value = str(value)
        if name == "search":
            return self._search(value)
        if name == "open":
            return self._open(value.strip().strip("[]"), arguments.get("part", 1))
        meta = self._task.meta
        g = grade(value, meta["answers"], opened=self._opened, retrieved=self._retrieved, evidence=meta["evidence"],
                  answer_weight=self.answer_weight)
        return StepResult(f"Answer recorded: {value}", done=True, reward=g.reward,
                          info={"answer": value, "grade": g})

    def _search(self, query: str) -> StepResult:
        hits = self.corpus.search(query, k=self.search_k)
        if not hits:
            return StepResult(f"No results for {query!r}.")
        lines = [f"Results for {query!r}:"]
        for i, (doc, _) in enumerate(hits, 1):
            self._retrieved.add(doc.docid)
            body = " ".join(doc.text.split())
            snippet = body[: self.snippet_chars] + ("..." if len(body) > self.snippet_chars else "")
            label = doc.title or doc.url
            lines.append(f"{i}. [{doc.docid}] {label}: {snippet}" if label else f"{i}. [{doc.docid}] {snippet}")
        return StepResult("\n".join(lines))

    def _open(self, docid: str, part: Any) -> StepResult:
        doc = self.corpus.get(docid)
        if doc is None:
            return StepResult(f"Error: no document {docid!r}. Use a docid from the search results.")
        parts = text_parts(doc.text, self.open_chars)
        if isinstance(part, str) and part.strip().isdigit():
            part = int(part)
        if not isinstance(part, int) or isinstance(part, bool) or not 1 <= part <= len(parts):
            return StepResult(f"Error: document {docid!r} has {len(parts)} part(s); part {part!r} does not exist.")
        self._opened.add(docid)
        head = [f"[{docid}] {doc.title}" if doc.title else f"[{docid}]"] + ([doc.url] if doc.url else [])
        tail = [f"[part {part} of {len(parts)}; open part {part + 1} for more]"] if part < len(parts) else []
        return StepResult("\n".join([*head, "", parts[part - 1], *tail]))

    def expert(self) -> CorpusExpert:
        return CorpusExpert()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "corpus": self.corpus_arg, "queries": self.queries_arg,
                "corpus_sha256": self.sha256["corpus"], "queries_sha256": self.sha256["queries"],
                "world_seed": self.world_seed, "search_k": self.search_k, "snippet_chars": self.snippet_chars,
                "open_chars": self.open_chars, "answer_weight": self.answer_weight}


def grade_record(traj: Trajectory, *, answer_weight: float | None = None) -> Grade:
    """The grade of a recorded corpus episode, re-derived from its messages alone.

    Opened: the docids of ``open`` calls whose environment-authored result served a document (not an
    ``Error: ...`` and not an injected fault); retrieved: the docids listed by served ``search``
    results; the answer: the one the episode recorded (none: reward 0). ``answer_weight`` defaults to
    the recorded environment's. Equal to the recorded ``reward`` (a test checks it), so exact match and
    the recalls of a whole file can be reported without rerunning it.
    """
    env = traj.meta.get("env") or {}
    if env.get("name") != CorpusEnv.name or traj.task is None:
        raise InputError(f"{traj.id}: not a corpus episode (env {env.get('name')!r})")
    w = env["answer_weight"] if answer_weight is None else answer_weight
    calls = {tc.id: (tc.name, call_arguments(tc.arguments)) for m in traj.messages for tc in m.tool_calls}
    opened: set[str] = set()
    retrieved: set[str] = set()
    for m in traj.messages:
        name, args = calls.get(m.tool_call_id or "", (None, None))
        if m.role != "tool" or m.author != "environment" or m.meta.get("fault") or m.content.startswith(FAILED):
            continue
        if name == "open" and args is not None:
            opened.add(str(args.get("docid")).strip().strip("[]"))
        elif name == "search":
            retrieved.update(RESULT_RE.findall(m.content))
    answer = (traj.outcome or {}).get("answer")
    g = grade(answer or "", traj.task.meta["answers"], opened=opened, retrieved=retrieved,
              evidence=traj.task.meta["evidence"], answer_weight=w)
    return g if answer is not None else Grade(0.0, g.evidence_recall, g.retrieval_recall, 0.0)
