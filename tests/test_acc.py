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
        rec, why = compile_record(t, env.world, tokenizer, budget=budget, seed=0)
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
    orders = {tuple(compile_record(t, env.world, tokenizer, budget=4000, seed=s)[0].meta["acc"]["order"])
              for s in range(4)}
    assert len(orders) > 1
    same = [compile_record(t, env.world, tokenizer, budget=4000, seed=1)[0] for _ in range(2)]
    assert same[0].messages[1].content == same[1].messages[1].content  # seeded: reproducible


def test_wrong_answers_are_not_admitted(episodes, tokenizer):
    env, trajs = episodes
    bad = trajs[0].model_copy(deep=True, update={"reward": 0.0, "outcome": {**trajs[0].outcome, "answer": "nope"}})
    assert compile_record(bad, env.world, tokenizer, budget=4000)[0] is None
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
