"""ACC compile: gold evidence always inside the budget, seeded order, only verified answers admitted."""

from __future__ import annotations

import json

import pytest

from memorywalker.rollout import ExpertPolicy, HarnessConfig, WebSearchEnv, run_episode
from memorywalker.transforms.acc import compile_record, qa_answer, visited_and_candidates

SMALL = {"n_cities": 2, "n_companies": 3, "n_people": 3, "n_distractors": 2}


@pytest.fixture(scope="module")
def episodes(tokenizer):
    env = WebSearchEnv(0, world_size=SMALL)
    return env, [run_episode(env, env.task(s, i), ExpertPolicy(), tokenizer, HarnessConfig("none"))
                 for s in ("lookup", "bridge", "chain", "comparison") for i in range(2)]


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("budget", [700, 1200, 4000])
def test_gold_evidence_whole_and_within_budget(episodes, tokenizer, budget):
    """Every opened page's full text is in the context, the context fits B, distractors fill what is left."""
    env, trajs = episodes
    admitted = 0
    for t in trajs:
        rec, why = compile_record(t, env, tokenizer, budget=budget, seed=0)
        opened, listed = visited_and_candidates(t)
        gold_tokens = sum(n_tokens(tokenizer, f"Document [{p}]\n{env.world.pages[p].text}") for p in opened)
        if rec is None:
            assert why.startswith("gold evidence exceeds") and gold_tokens > budget - 20
            continue
        admitted += 1
        user = rec.messages[1].content
        assert n_tokens(tokenizer, user) <= budget
        for p in opened:
            assert f"Document [{p}]\n{env.world.pages[p].text}" in user
        assert rec.meta["acc"]["gold"] == opened
        assert rec.messages[2].content.endswith(f"Answer: {t.task.answer}")
        assert rec.lineage.parent == t.id and rec.task.split == t.task.split
        if budget == 4000 and listed:
            assert rec.meta["acc"]["distractors"]  # room left: unvisited results go in as distractors
    assert admitted >= (len(trajs) if budget >= 4000 else 1)


def test_order_changes_with_the_seed(episodes, tokenizer):
    env, trajs = episodes
    t = next(t for t in trajs if len(visited_and_candidates(t)[0]) + len(visited_and_candidates(t)[1]) >= 4)
    orders = {tuple(compile_record(t, env, tokenizer, budget=4000, seed=s)[0].meta["acc"]["order"])
              for s in range(4)}
    assert len(orders) > 1
    same = [compile_record(t, env, tokenizer, budget=4000, seed=1)[0] for _ in range(2)]
    assert same[0].messages[1].content == same[1].messages[1].content  # seeded: reproducible


def test_wrong_answers_are_not_admitted(episodes, tokenizer):
    env, trajs = episodes
    bad = trajs[0].model_copy(deep=True, update={"reward": 0.0, "outcome": {**trajs[0].outcome, "answer": "nope"}})
    assert compile_record(bad, env, tokenizer, budget=4000)[0] is None
    assert qa_answer("- X | founded: 1\nAnswer: 1900 ") == "1900"


def test_compile_acc_cli(episodes, tokenizer, tmp_path, kit):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app
    from memorywalker.records import write_trajectories

    env, trajs = episodes
    write_trajectories(tmp_path / "e.jsonl", trajs)
    res = CliRunner().invoke(app, ["compile-acc", str(tmp_path / "e.jsonl"), "-o", str(tmp_path / "acc.jsonl"),
                                   "--budget", "4000", "--tokenizer", str(kit[0]), "--no-progress"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output.strip().splitlines()[-1])
    assert s["written"] == len(trajs) and s["token_expansion"] > 0


def test_corpus_episodes_compile_with_their_evidence_documents(tokenizer):
    """The corpus expert searches the question once (5 results) and opens each evidence document: the gold
    documents are exactly the task's evidence ids, each the corpus document's whole text; the distractors are
    the other listed results (5 minus the evidence found among them, at most); the target is its answer."""
    from memorywalker.rollout.environments.corpus.env import CorpusEnv
    from memorywalker.transforms.acc import env_of

    env = CorpusEnv()
    trajs = [run_episode(env, env.task("all", i), env.expert(), tokenizer, HarnessConfig("none")) for i in range(3)]
    for t in trajs:
        assert env_of(t).name == "corpus"
        rec, why = compile_record(t, env_of(t), tokenizer, budget=100_000, seed=0)
        assert rec is not None, why
        acc = rec.meta["acc"]
        assert acc["gold"] == t.task.meta["evidence"]
        assert sorted(acc["order"]) == sorted(acc["gold"] + acc["distractors"])
        assert set(acc["gold"]).isdisjoint(acc["distractors"]) and len(acc["distractors"]) <= 5
        for d in acc["gold"]:
            assert f"Document [{d}]\n{env.corpus.get(d).text}" in rec.messages[1].content
        assert rec.messages[2].content == f"Answer: {t.outcome['answer']}"


def test_vault_episodes_compile_with_the_boxes_they_opened(tokenizer):
    """A recall-2 expert episode opens its 2 boxes: gold = those boxes' observations as recorded (each holds
    'The label reads: BOX CODE'); distractors = other boxes of the same task's world, as many as fit the
    budget; the target is 'Answer: ' + the task's answer; a budget below the gold alone rejects it."""
    from memorywalker.rollout.environments.vault.env import VaultEnv

    env = VaultEnv(0)
    t = run_episode(env, env.task("recall-2", 0), env.expert(), tokenizer, HarnessConfig("none"))
    assert t.reward == 1.0
    boxes, codes = t.task.meta["boxes"], t.task.meta["codes"]
    rec, why = compile_record(t, VaultEnv(0), tokenizer, budget=400, seed=0)
    assert rec is not None, why
    user = rec.messages[1].content
    assert rec.meta["acc"]["gold"] == boxes
    for b, c in zip(boxes, codes, strict=True):
        assert f"Document [{b}]\nThe label reads: {b} {c}\n" in user
    assert rec.meta["acc"]["distractors"] and not set(rec.meta["acc"]["distractors"]) & set(boxes)
    assert n_tokens(tokenizer, user) <= 400
    assert rec.messages[2].content == f"Answer: {t.task.answer}"
    assert compile_record(t, VaultEnv(0), tokenizer, budget=20, seed=0) == (None, "gold evidence exceeds the budget 20")
    # the vault reads box names case-blind: an episode that opened 'KAL' opened box kal
    shouted = t.model_copy(deep=True)
    call = next(tc for m in shouted.messages for tc in m.tool_calls if tc.name == "open")
    call.arguments = {"box": call.arguments["box"].upper()}
    assert compile_record(shouted, VaultEnv(0), tokenizer, budget=400, seed=0)[0].meta["acc"]["gold"] == boxes


def test_an_environment_without_documents_is_refused_in_one_line(episodes):
    from memorywalker.errors import InputError
    from memorywalker.transforms.acc import env_of

    _, trajs = episodes
    other = trajs[0].model_copy(update={"meta": {**trajs[0].meta, "env": {"name": "maze"}}})
    with pytest.raises(InputError, match="an environment with documents .*not 'maze'"):
        env_of(other)


def test_compile_acc_sets_aside_episodes_without_documents_and_keeps_the_others(episodes, tokenizer, tmp_path):
    """8 web-search episodes and 2 of them relabelled as another environment's: 6 compiled (budget 4,000 fits
    every one, as the budget test shows), 2 set aside under one reason that names the environment."""
    from memorywalker.records import read_trajectories, write_trajectories
    from memorywalker.transforms.acc import compile_file

    _, trajs = episodes
    mixed = [t.model_copy(update={"meta": {**t.meta, "env": {"name": "maze"}}}) if i < 2 else t for i, t in enumerate(trajs)]
    write_trajectories(tmp_path / "in.jsonl", mixed)
    s = compile_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", tokenizer, budget=4000)
    assert s["parents"] == 8 and s["written"] == 6 == len(read_trajectories(tmp_path / "out.jsonl"))
    [(reason, n)] = s["rejected"].items()
    assert n == 2 and "environment with documents" in reason and "'maze'" in reason
