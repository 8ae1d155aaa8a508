"""``memorywalker rollout --env corpus``: the expert and an HF policy under two harnesses, records that
validate, resume/append, the field mapping (BrowseComp-Plus, Pyserini, BEIR, Parquet), and one-line
errors for bad corpus and queries files."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.records import read_trajectories
from memorywalker.rollout import CorpusEnv, HarnessConfig, rollout
from memorywalker.rollout.environments.corpus.documents import tiny_corpus
from memorywalker.rollout.environments.corpus.env import grade_record

runner = CliRunner()


def _rollout(out, tok_dir, *extra: str):
    args = ["rollout", "--env", "corpus", "-o", str(out), "--tokenizer", str(tok_dir), "--no-progress", *extra]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res


def _validate(path, tok_dir) -> dict:
    res = runner.invoke(app, ["validate", str(path), "--strict", "--json", "--tokenizer", str(tok_dir)])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


@pytest.mark.parametrize("harness", ["claude-code", "opencode"])
def test_expert_and_hf_policy_records_validate_with_evictions(tmp_path, kit, harness):
    """A 700-token budget is under the first prompt of the kit tokenizer (~600 tokens) times the 0.8
    watermark, so both harnesses compress before every act call after the first: every episode of the
    expert (8 queries) and of the random kit model (2 queries, 3 steps) records evictions. The kit model
    scores 0, and the grade re-derived from each record equals its reward."""
    tok_dir, model_dir = kit
    expert, hf = tmp_path / "expert.jsonl", tmp_path / "hf.jsonl"
    common = ["--compressor", harness, "--budget", "700"]
    _rollout(expert, tok_dir, *common, "--n", "8")
    _rollout(hf, tok_dir, *common, "--n", "2", "--max-steps", "3", "--max-new-tokens", "16",
             "--sampler", f"hf:{model_dir}")
    for path, n in ((expert, 8), (hf, 2)):
        summary = _validate(path, tok_dir)
        assert (summary["read"], summary["accepted"], summary["rejected"]) == (n, n, 0)
        trajs = read_trajectories(path)
        assert all(t.evictions for t in trajs)
        assert all(grade_record(t).reward == t.reward for t in trajs)
        assert all(t.meta["env"]["name"] == "corpus" and t.meta["harness"]["name"] == harness for t in trajs)
    assert [t.reward for t in read_trajectories(expert)] == [1.0] * 8
    kinds = {e.kind for t in read_trajectories(expert) for e in t.evictions}
    assert kinds == {"summarize"}  # at this budget opencode's placeholders are not enough either
    hf_calls = [c for t in read_trajectories(hf) for c in t.calls]
    assert hf_calls and all(c.rollout_logprobs and len(c.rollout_logprobs) == len(c.response_tokens)
                            for c in hf_calls)


def test_resume_appends_and_refuses_another_corpus(tmp_path, kit, tokenizer):
    """--n 3 then --n 5 appends two episodes and writes what one --n 5 run writes; a kill mid-write
    (half a line) resumes to the same bytes; the same file with another corpus is refused."""
    tok_dir = kit[0]
    out, whole = tmp_path / "r.jsonl", tmp_path / "whole.jsonl"
    _rollout(out, tok_dir, "--compressor", "opencode", "--n", "3")
    _rollout(out, tok_dir, "--compressor", "opencode", "--n", "5")
    _rollout(whole, tok_dir, "--compressor", "opencode", "--n", "5")
    assert out.read_bytes() == whole.read_bytes()
    assert [t.task.id for t in read_trajectories(out)] == ["q1", "q2", "q3", "q4", "q5"]
    lines = whole.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:2]) + lines[2][:100])
    env = CorpusEnv()
    _, summary = rollout(env, env.expert(), tokenizer, HarnessConfig("opencode"), suite="all", n=5, seed=0, out=out)
    assert (summary.skipped, summary.written) == (2, 3) and out.read_bytes() == whole.read_bytes()
    docs, queries = tmp_path / "d.jsonl", tmp_path / "q.jsonl"
    docs.write_bytes(tiny_corpus()[0].read_bytes())
    queries.write_bytes(tiny_corpus()[1].read_bytes())
    res = runner.invoke(app, ["rollout", "--env", "corpus", "--corpus", str(docs), "--queries", str(queries),
                              "--compressor", "opencode", "--n", "6", "-o", str(out), "--tokenizer", str(tok_dir),
                              "--no-progress"])
    assert res.exit_code == 2 and "different configuration" in res.output and "env.corpus" in res.output


def _write(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


DOCS = [{"docid": "a", "text": "alpha"}, {"docid": "b", "text": "beta"}]
QUERIES = [{"query_id": "1", "query": "what?", "answer": "alpha", "evidence_docs": ["a"]}]
BAD = {  # name: (which file, its rows, the error after "FILE: ")
    "bad json": ("docs", [DOCS[0], '{"docid": "b", "text": '], "line 2: not valid JSON (Expecting value at column 24)"),
    "not an object": ("docs", [DOCS[0], "[1, 2]"], "line 2: a JSON object expected, got list"),
    "no id": ("docs", [{"text": "x"}], "line 1: no document id (a field named docid or doc_id or id or _id)"),
    "no text": ("docs", [{"docid": "a"}], "line 1: document 'a' has no text"),
    "duplicate id": ("docs", [DOCS[0], "", DOCS[1], DOCS[0]], "line 4: duplicate document id 'a' (first at line 1)"),
    "two ids": ("docs", [{"docid": "a", "id": "b", "text": "x"}],
                "line 1: fields 'docid', 'id' both give the document id and differ"),
    "unknown evidence": ("queries", [QUERIES[0], {**QUERIES[0], "query_id": "2", "evidence_docs": ["a", "zz"]}],
                         "line 2: evidence document 'zz' of query '2' is not in"),
    "no answer": ("queries", [{"query_id": "1", "query": "what?"}], "line 1: the answer must be a non-empty string"),
    "duplicate query": ("queries", [QUERIES[0], QUERIES[0]], "line 2: duplicate query id '1' (first at line 1)"),
    "empty": ("queries", [], "no queries"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_corpus_or_queries_file_is_one_line_naming_file_and_line(tmp_path, kit, case):
    which, rows, expected = BAD[case]
    docs, queries = tmp_path / "docs.jsonl", tmp_path / "queries.jsonl"
    _write(docs, rows if which == "docs" else DOCS)
    _write(queries, rows if which == "queries" else QUERIES)
    out = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["rollout", "--env", "corpus", "--corpus", str(docs), "--queries", str(queries),
                              "--n", "1", "-o", str(out), "--tokenizer", str(kit[0]), "--no-progress"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    bad = docs if which == "docs" else queries
    assert lines[0].startswith(f"memorywalker rollout: error: {bad}: {expected}"), lines[0]
    assert not out.exists()


def test_missing_file_and_misused_options(tmp_path, kit):
    base = ["rollout", "--n", "1", "-o", str(tmp_path / "r.jsonl"), "--tokenizer", str(kit[0]), "--no-progress"]
    res = runner.invoke(app, [*base, "--env", "corpus", "--corpus", str(tmp_path / "nope.jsonl"),
                              "--queries", str(tiny_corpus()[1])])
    assert res.exit_code == 2 and "nope.jsonl: No such file or directory" in res.output
    res = runner.invoke(app, [*base, "--env", "corpus", "--corpus", str(tiny_corpus()[0])])
    assert res.exit_code == 2 and "go together" in res.output
    res = runner.invoke(app, [*base, "--env", "vault", "--suite", "recall-2", "--corpus", str(tiny_corpus()[0])])
    assert res.exit_code == 2 and "apply to --env corpus" in res.output
    res = runner.invoke(app, [*base, "--env", "vault"])
    assert res.exit_code == 2 and "--suite is required for env vault" in res.output


def test_browsecomp_plus_pyserini_beir_and_parquet_layouts_load_alike(tmp_path):
    """The same two documents and query in BrowseComp-Plus's decrypted layout (evidence_docs as objects
    with docid and text, plus gold_docs / negative_docs, ignored), Pyserini's (id / contents), BEIR's
    (_id / title / text, question / answers), integer ids and answers, gzip, and Parquet give the same tasks
    and search results."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [{"docid": "11", "text": "The harbour lantern festival.", "url": "https://x.example/11"},
            {"docid": "12", "text": "A quiet inland market town.", "url": "https://x.example/12"}]
    bcp_query = {"query_id": "769", "query": "Which festival?", "answer": "lantern festival",
                 "gold_docs": [{"docid": "11", "text": "..."}], "negative_docs": [{"docid": "12", "text": "..."}],
                 "evidence_docs": [{"docid": "11", "text": "The harbour lantern festival."}]}
    layouts = {
        "bcp": (docs, [bcp_query]),
        "pyserini": ([{"id": d["docid"], "contents": d["text"], "url": d["url"]} for d in docs],
                     [{"qid": "769", "question": "Which festival?", "answers": ["lantern festival"],
                       "evidence_ids": ["11"]}]),
        "beir": ([{"_id": d["docid"], "title": None, "text": d["text"], "url": d["url"]} for d in docs],
                 [{"_id": "769", "query": "Which festival?", "answer": "lantern festival", "evidence": [11]}]),
        "int answer": (docs, [{"query_id": 769, "query": "Which festival?", "answer": ["lantern festival", 11],
                               "evidence_docids": ["11"]}]),
    }
    envs = []
    for name, (d, q) in layouts.items():
        _write(tmp_path / f"{name}-d.jsonl", d)
        _write(tmp_path / f"{name}-q.jsonl", q)
        envs.append(CorpusEnv(tmp_path / f"{name}-d.jsonl", tmp_path / f"{name}-q.jsonl"))
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in docs))
    pq.write_table(pa.Table.from_pylist([bcp_query]), tmp_path / "q.parquet")
    envs.append(CorpusEnv(tmp_path / "d.jsonl.gz", tmp_path / "q.parquet"))
    assert envs[3].task("all", 0).meta["answers"] == ["lantern festival", "11"]
    for env in envs:
        task = env.task("all", 0)
        assert (task.id, task.meta["question"], task.meta["answers"][0], task.meta["evidence"]) == \
               ("769", "Which festival?", "lantern festival", ["11"])
        env.reset(task)
        assert env.step("search", {"query": "lantern"}).observation.splitlines()[1].startswith(
            "1. [11] https://x.example/11: The harbour lantern festival.")
    res = runner.invoke(app, ["rollout", "--env", "corpus", "--corpus", str(tmp_path / "d.jsonl.gz"),
                              "--queries", str(tmp_path / "q.parquet"), "--n", "2", "-o", str(tmp_path / "r.jsonl"),
                              "--no-progress"])
    assert res.exit_code == 2 and "holds 1 queries" in res.output
