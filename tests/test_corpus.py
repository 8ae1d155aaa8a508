"""The corpus environment: BM25 retrieval against a reference written from the formula, grading by
hand, the tools, the oracle expert under every harness, the field mapping, and the records."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from memorywalker.rollout import (
    COMPRESSORS,
    ENVIRONMENTS,
    CorpusEnv,
    CorpusExpert,
    HarnessConfig,
    replay_contexts,
    rollout,
)
from memorywalker.rollout.environments.corpus.documents import (
    Corpus,
    Document,
    grade,
    read_documents,
    text_parts,
    tiny_corpus,
)
from memorywalker.rollout.environments.corpus.env import grade_record

# --- BM25 ----------------------------------------------------------------------------------------------


def reference_bm25(docs: list[Document], query: str, k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    """Lucene BM25 written from the formula (shares no code with bm25s): lowercase words of 2+ word
    characters, English stopwords dropped, a document is its title line and its text;
    score = sum over query terms of idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl)),
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))."""
    from bm25s.stopwords import STOPWORDS_EN  # the word list is data, not the code under test

    stop = set(STOPWORDS_EN)

    def words(text: str) -> list[str]:
        return [w for w in re.findall(r"(?u)\b\w\w+\b", text.lower()) if w not in stop]

    bags = [Counter(words(f"{d.title}\n{d.text}" if d.title else d.text)) for d in docs]
    n, avgdl = len(docs), sum(sum(c.values()) for c in bags) / len(docs)
    scores = {}
    for d, bag in zip(docs, bags, strict=True):
        dl, s = sum(bag.values()), 0.0
        for t in set(words(query)):
            df = sum(t in c for c in bags)
            if df and bag[t]:
                s += math.log(1 + (n - df + 0.5) / (df + 0.5)) * bag[t] / (bag[t] + k1 * (1 - b + b * dl / avgdl))
        if s > 0:
            scores[d.docid] = s
    return scores


def test_bm25_scores_by_hand():
    """Docs 'red apples and pears' (dl 3: 'and' is a stopword), 'green pears' (2), 'blue sky' (2); avgdl 7/3.
    'pears': df 2, idf = ln(1 + 1.5/2.5) = ln 1.6 = 0.47000; 'apples': df 1, idf = ln(1 + 2.5/1.5) = 0.98083.
    Doc a: norm = 1.5 (0.25 + 0.75 * 3 / (7/3)) = 1.82143, weight 1 / 2.82143 = 0.35443, score
    (0.47000 + 0.98083) * 0.35443 = 0.51422. Doc b: norm = 1.33929, score 0.47000 / 2.33929 = 0.20092.
    Doc c shares no term: not returned."""
    c = Corpus([Document("a", "red apples and pears"), Document("b", "green pears"), Document("c", "blue sky")])
    hits = c.search("pears apples", k=3)
    assert [d.docid for d, _ in hits] == ["a", "b"]
    assert [s for _, s in hits] == pytest.approx([0.51422, 0.20092], abs=1e-5)
    assert c.search("and the of") == []  # only stopwords: no query at all


QUERIES = {  # hand-picked: the document every term of the query points at comes first
    "schooner wrecked tin": "115",  # the schooner, not the flower that shares its name
    "larkspur flowers meadows": "123",  # the flower, not the schooner
    "Mount Tallis first climbed": "109",  # not the brewery named after it
    "puffin count 2019": "127",
    "customs house library": "130",
    "Ilse Marrow apprenticed": "104",  # "apprenticed" is hers alone (no stemming: not "apprentices")
}


@pytest.mark.parametrize("query", list(QUERIES))
def test_bm25_retrieval_on_the_tiny_corpus_matches_the_reference(query):
    env = CorpusEnv()
    hits = env.corpus.search(query, k=5)
    ref = reference_bm25(env.corpus.documents, query)
    ranked = sorted(ref, key=lambda d: -ref[d])[:5]
    assert hits[0][0].docid == QUERIES[query]
    assert [d.docid for d, _ in hits] == ranked
    assert [s for _, s in hits] == pytest.approx([ref[d] for d in ranked], rel=1e-5)  # bm25s scores in float32


# --- grading --------------------------------------------------------------------------------------------


def test_grading_by_hand():
    """Evidence {107, 108, 109}, weight 0.5. Right answer, two of three opened: 0.5 + 0.5 * 2/3 = 0.8333.
    Wrong answer, all opened: 0.5. Right answer, nothing opened but all three in search results:
    0.5 (retrieval recall 1, not rewarded). Normalization: 'The 1838.' equals '1838'. An alias list
    matches any. No evidence ids: reward = exact match. Weight 1: exact match only; weight 0.2:
    0.2 * 0 + 0.8 * 1/3 = 0.2667."""
    ev = ["107", "108", "109"]
    g = grade("1838", ["1838"], opened={"107", "109", "101"}, retrieved=set(), evidence=ev)
    assert (g.exact_match, g.evidence_recall, g.retrieval_recall) == (1.0, pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert g.reward == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert grade("1839", ["1838"], opened=set(ev), retrieved=set(), evidence=ev).reward == 0.5
    g = grade("The 1838.", ["1838"], opened=set(), retrieved=set(ev), evidence=ev)
    assert (g.exact_match, g.evidence_recall, g.retrieval_recall, g.reward) == (1.0, 0.0, 1.0, 0.5)
    assert grade("Tobias", ["Tobias Wren", "Tobias"], opened=set(), retrieved=set(), evidence=[]).reward == 1.0
    g = grade("x", ["y"], opened={"1"}, retrieved=set(), evidence=[])
    assert (g.evidence_recall, g.reward) == (None, 0.0)
    assert grade("1838", ["1838"], opened=set(), retrieved=set(), evidence=ev, answer_weight=1.0).reward == 1.0
    assert grade("no", ["1838"], opened={"108"}, retrieved=set(), evidence=ev,
                 answer_weight=0.2).reward == pytest.approx(0.8 / 3)


def test_an_episode_is_graded_on_what_its_tools_served():
    """q2 (evidence 107, 108, 109): open 107 and 109 (twice: counts once), an unknown docid and a part
    that does not exist serve nothing; search results are retrieved, not opened. Right answer:
    0.5 + 0.5 * 2/3; the same steps with a wrong answer: 0.5 * 2/3."""
    env = CorpusEnv()
    task = env.task("all", 1)
    assert task.id == "q2" and task.meta["evidence"] == ["107", "108", "109"] and task.answer == "1838"
    for answer, reward in (("1838", 0.5 + 0.5 * 2 / 3), ("1204", 0.5 * 2 / 3)):
        env.reset(task)
        assert env.step("search", {"query": "River Sedge source hills"}).observation.startswith("Results for")
        assert env.step("open", {"docid": "107"}).observation.startswith("[107] River Sedge\nhttps://")
        assert env.step("open", {"docid": "[109]"}).observation.startswith("[109] Mount Tallis")
        env.step("open", {"docid": "109"})
        assert env.step("open", {"docid": "999"}).observation.startswith("Error: no document '999'")
        assert env.step("open", {"docid": "108", "part": 2}).observation.startswith("Error: document '108' has 1 part")
        assert env.step("open", {"doc": "108"}).observation.startswith("Error: open needs")
        assert env.step("lookup", {}).observation.startswith("Error: unknown tool")
        done = env.step("answer", {"text": answer})
        assert done.done and done.reward == pytest.approx(reward)
        assert done.info["grade"].evidence_recall == pytest.approx(2 / 3)


def test_long_documents_open_in_parts(tmp_path):
    """50 words of 6 characters joined by spaces (349 characters), open_chars=60: a part ends after the
    last space within its 60 characters, so it holds 8 words and their spaces (56 characters; a 9th
    word would end at 63): six parts of 56 and one of 13 ('word48 word49'). The parts rebuild the
    text, each but the last says what follows."""
    text = " ".join(f"word{i:02d}" for i in range(50))
    parts = text_parts(text, 60)
    assert "".join(parts) == text and [len(p) for p in parts] == [56] * 6 + [13]
    docs, queries = tmp_path / "d.jsonl", tmp_path / "q.jsonl"
    docs.write_text(f'{{"docid": "long", "text": "{text}"}}\n')
    queries.write_text('{"query_id": "1", "query": "?", "answer": "word07", "evidence_docs": ["long"]}\n')
    env = CorpusEnv(docs, queries, open_chars=60)
    env.reset(env.task("all", 0))
    first = env.step("open", {"docid": "long"}).observation.split("\n")
    assert first == ["[long]", "", parts[0], "[part 1 of 7; open part 2 for more]"]
    assert env.step("open", {"docid": "long", "part": "7"}).observation.split("\n") == ["[long]", "", parts[6]]
    assert "part 8 does not exist" in env.step("open", {"docid": "long", "part": 8}).observation


# --- the expert and the harnesses -----------------------------------------------------------------------


@pytest.mark.parametrize("harness", list(COMPRESSORS))
def test_the_oracle_expert_answers_every_query_under_every_harness(tokenizer, harness):
    """The expert opens every evidence document and answers the gold answer: reward 1 on all 8 queries.
    The records replay (evictions complete) and the grade re-derived from the messages is the reward."""
    env = CorpusEnv()
    episodes, summary = rollout(env, env.expert(), tokenizer, HarnessConfig(harness, budget=900), suite="all",
                                n=8, seed=0)
    assert summary.success == 1.0
    for t in episodes:
        assert replay_contexts(t) == [c.context for c in t.calls]
        g = grade_record(t)
        assert (g.reward, g.exact_match, g.evidence_recall) == (t.reward, 1.0, 1.0)
        opened = [tc.arguments["docid"] for m in t.messages for tc in m.tool_calls if tc.name == "open"]
        assert opened == t.task.meta["evidence"]
    if harness in ("claude-code", "opencode", "tc-rag"):  # 900 tokens hold about two lookups
        assert all(len(t.evictions) >= 1 for t in episodes)


def test_the_expert_retries_faulted_lookups_and_the_record_grades_like_the_env(tokenizer):
    """Under 40 % injected faults the expert retries each failed or stale lookup; a faulted open serves
    nothing (the environment does not see it), and grade_record skips faulted observations too."""
    from memorywalker.rollout.episodes.faults import FaultConfig, FaultInjector

    env = FaultInjector(CorpusEnv(), FaultConfig(rate=0.4, seed=3))
    episodes, _ = rollout(env, CorpusExpert(), tokenizer, HarnessConfig("opencode"), suite="all", n=8, seed=0)
    faults = [m.meta["fault"] for t in episodes for m in t.messages if m.meta.get("fault")]
    assert len(faults) >= 5 and set(faults) <= {"error", "timeout", "stale"}
    assert all(grade_record(t).reward == t.reward for t in episodes)
    assert sum(t.reward == 1.0 for t in episodes) >= 7


def test_grade_record_counts_only_served_documents(tokenizer):
    """q2's expert episode opens 107, 108, 109: grade 1 from the record. The same record with the
    result of 'open 108' marked as an injected fault, or turned into an error, counts two of three
    opened: 0.5 + 0.5 * 2/3. A wrong recorded answer keeps the recall: 0.5 * 1 = 0.5; none: reward 0."""
    env = CorpusEnv()
    episodes, _ = rollout(env, env.expert(), tokenizer, HarnessConfig("none"), suite="all", n=2, seed=0)
    t = episodes[1]
    assert t.task.id == "q2" and grade_record(t).reward == t.reward == 1.0
    call = next(tc.id for m in t.messages for tc in m.tool_calls if tc.arguments.get("docid") == "108")
    i = next(i for i, m in enumerate(t.messages) if m.tool_call_id == call)
    for change in ({"meta": {"fault": "stale"}}, {"content": "Error: open timed out after 30 s. Try again."}):
        u = t.model_copy(deep=True)
        u.messages[i] = u.messages[i].model_copy(update=change)
        g = grade_record(u)
        assert (g.evidence_recall, g.reward) == (pytest.approx(2 / 3), pytest.approx(0.5 + 0.5 * 2 / 3))
    u = t.model_copy(deep=True, update={"outcome": {**t.outcome, "answer": "1204"}})
    assert grade_record(u).reward == 0.5
    u = t.model_copy(deep=True, update={"outcome": {**t.outcome, "answer": None}})
    assert (grade_record(u).reward, grade_record(u).evidence_recall) == (0.0, 1.0)


def test_the_index_cache_is_saved_once_and_reused(tmp_path, monkeypatch):
    """The first env indexes and saves under bm25-<corpus sha256>; the second loads it (indexing is
    made to fail) and ranks and scores alike; a stamp that does not match (another document count)
    is not read: the index is rebuilt."""
    import json

    import bm25s

    from memorywalker.rollout.environments.corpus.documents import STAMP

    first = CorpusEnv(index_cache=tmp_path)
    expected = [(d.docid, s) for d, s in first.corpus.search("schooner wrecked tin")]
    (saved,) = tmp_path.iterdir()
    assert saved.name == f"bm25-{first.config()['corpus_sha256']}" and (saved / STAMP).exists()

    def no_indexing(*args, **kwargs):
        raise AssertionError("indexed again")

    monkeypatch.setattr(bm25s.BM25, "index", no_indexing)
    again = CorpusEnv(index_cache=tmp_path)
    assert [(d.docid, s) for d, s in again.corpus.search("schooner wrecked tin")] == expected
    stamp = json.loads((saved / STAMP).read_text())
    (saved / STAMP).write_text(json.dumps({**stamp, "documents": 35}))
    with pytest.raises(AssertionError, match="indexed again"):
        CorpusEnv(index_cache=tmp_path).corpus.search("tin")
    monkeypatch.undo()
    assert [(d.docid, s) for d, s in CorpusEnv(index_cache=tmp_path).corpus.search("schooner wrecked tin")] == expected
    assert json.loads((saved / STAMP).read_text()) == stamp and len(list(tmp_path.iterdir())) == 1


def test_registry_tasks_and_splits():
    env = ENVIRONMENTS["corpus"]()  # the default: the shipped tiny corpus
    assert isinstance(env, CorpusEnv) and env.suites == ("all",)
    assert [env.task("all", i).id for i in range(8)] == [f"q{i}" for i in range(1, 9)]
    assert env.task("all", 3) == env.task("all", 3)
    assert {CorpusEnv(world_seed=s).task("all", 0).split for s in range(40)} == {"train", "valid", "test"}
    with pytest.raises(ValueError, match="holds 8 queries"):
        env.task("all", 8)
    with pytest.raises(ValueError, match="unknown suite"):
        env.task("lookup", 0)
    assert len(read_documents(tiny_corpus()[0])) == 36


def test_copies_of_the_env_grade_their_own_episodes():
    """Lockstep runs each episode on copy.copy(env): an episode's opened documents are its own."""
    import copy

    env = CorpusEnv()
    a, b = copy.copy(env), copy.copy(env)
    a.reset(env.task("all", 7))  # q8: evidence 118
    b.reset(env.task("all", 7))
    a.step("open", {"docid": "118"})
    assert a.step("answer", {"text": "Brackwater Tin Company"}).reward == 1.0
    assert b.step("answer", {"text": "Brackwater Tin Company"}).reward == 0.5  # b opened nothing


def test_a_recorded_config_rebuilds_the_env_and_pins_its_files(tmp_path):
    docs, queries = tmp_path / "d.jsonl", tmp_path / "q.jsonl"
    src_docs, src_queries = tiny_corpus()
    docs.write_bytes(src_docs.read_bytes())
    queries.write_bytes(src_queries.read_bytes())
    cfg = CorpusEnv(docs, queries).config()
    again = {k: v for k, v in cfg.items() if k != "name"}
    assert CorpusEnv(**again).config() == cfg
    queries.write_bytes(src_queries.read_bytes().replace(b'"1838"', b'"1839"'))
    with pytest.raises(ValueError, match="not the file the records were made with"):
        CorpusEnv(**again)
    with pytest.raises(ValueError, match="go together"):
        CorpusEnv(docs)
