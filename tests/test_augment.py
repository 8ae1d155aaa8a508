"""Schema augmentation: no old identifier survives, the renamed record replays in the adapted environment,
and the expert still solves augmented tasks."""

from __future__ import annotations

import json

import pytest

from memorywalker.records.schema import Task, ToolSchema
from memorywalker.rollout import (
    Environment,
    ExpertPolicy,
    HarnessConfig,
    StepResult,
    WebSearchEnv,
    run_episode,
)
from memorywalker.transforms.augment import (
    AugmentedEnv,
    RenamedPolicy,
    augment_record,
    check_no_old_identifiers,
    make_schema_map,
    render_tokens,
    surviving_identifiers,
)

SMALL = {"n_cities": 2, "n_companies": 3, "n_people": 3, "n_distractors": 2}
SUITES = ("lookup", "bridge", "chain", "navigation", "comparison")


@pytest.fixture(scope="module")
def env():
    return WebSearchEnv(0, world_size=SMALL)


@pytest.mark.parametrize("harness", ["none", "tc-rag"])
def test_augmented_records_carry_no_old_identifier_and_replay(env, tokenizer, harness):
    """Every old tool/argument name occurs in the parent (so the check can fire) and nowhere in the derived
    record; replaying each renamed call in the adapted environment gives the recorded observation."""
    for seed in (0, 1):
        m = make_schema_map(env.tools(), seed)
        assert set(m.words) == {"search", "open", "answer", "query", "page", "text"}
        assert not set(m.words.values()) & set(m.words)
        for suite in SUITES:
            parent = run_episode(env, env.task(suite, seed), ExpertPolicy(), tokenizer, HarnessConfig(harness))
            assert parent.reward == 1.0
            assert {"search", "open", "answer"} <= set(surviving_identifiers(parent, m))
            child = augment_record(parent, m)
            assert surviving_identifiers(child, m) == []
            assert child.lineage.parent == parent.id and child.task.split == parent.task.split
            assert [t.name for t in child.tools][:5] == m.order and len(m.order) == 3 + 2  # two distractors
            aenv = AugmentedEnv(env, m)
            aenv.reset(child.task)
            obs = {x.tool_call_id: x.content for x in child.messages if x.role == "tool"}
            replayed = 0
            for msg in child.messages:
                for tc in msg.tool_calls:
                    if tc.name in m.words.values():
                        assert aenv.step(tc.name, tc.arguments).observation == obs[tc.id]
                        replayed += 1
            assert replayed >= 2
            assert all(c.context_tokens is None for c in child.calls)  # old names live in the old token ids
            assert render_tokens(child, tokenizer) > render_tokens(parent, tokenizer)  # distractors add tokens


def test_check_rejects_a_surviving_identifier(env, tokenizer):
    """One leftover mention (in an observation, or as an argument key) is enough to reject the record."""
    m = make_schema_map(env.tools(), 0)
    parent = run_episode(env, env.task("lookup", 0), ExpertPolicy(), tokenizer, HarnessConfig("none"))
    child = augment_record(parent, m)
    bad = child.model_copy(deep=True)
    bad.messages[-1].content += " Use open next time."
    with pytest.raises(ValueError, match="open"):
        check_no_old_identifiers(bad, m)
    bad = child.model_copy(deep=True)
    tc = next(x for msg in bad.messages for x in msg.tool_calls)
    tc.arguments = {"query": "x"}
    with pytest.raises(ValueError, match="query"):
        check_no_old_identifiers(bad, m)


def test_expert_solves_augmented_tasks(env, tokenizer):
    """The expert, acting through the renamed interface, solves every task; an error names the new tools."""
    for seed in (0, 3):
        m = make_schema_map(env.tools(), seed)
        aenv = AugmentedEnv(env, m)
        for suite in SUITES:
            for i in range(2):
                traj = run_episode(aenv, aenv.task(suite, i), RenamedPolicy(ExpertPolicy(), m), tokenizer,
                                   HarnessConfig("none"))
                assert traj.reward == 1.0, (seed, suite, i)
                names = {tc.name for msg in traj.messages for tc in msg.tool_calls}
                assert names <= set(m.words.values()) and m.words["answer"] in names
        err = aenv.step("search", {"query": "x"}).observation
        assert err.startswith("Error") and m.words["search"] in err and "search" not in err.split()
        assert aenv.step(m.words["open"], {m.words["page"]: "no-such"}).observation.startswith("Error: no")


class Rounding(Environment):
    """A toy tool with an optional argument whose removal changes the result."""

    name = "rounding"
    system_prompt = "Call halve, then answer."

    def tools(self):
        return [ToolSchema(name="halve", parameters={"type": "object", "properties": {
            "number": {"type": "integer"}, "digits": {"type": "integer"}}, "required": ["number"]})]

    def task(self, suite, index):
        return Task(id=f"h-{index}", split="train")

    def reset(self, task):
        return "Halve 5."

    def step(self, name, arguments):
        if name != "halve":
            return StepResult(f"Error: unknown tool {name!r}. Valid tools: halve.")
        return StepResult(str(round(arguments["number"] / 2, int(arguments.get("digits", 0)))))


def test_removed_optional_argument_gets_a_fresh_observation():
    """halve(number=5, digits=1) = 2.5; with digits removed the adapter recomputes round(2.5, 0) = 2.0."""
    from memorywalker.records import TrajectoryBuilder

    env = Rounding()
    m = make_schema_map(env.tools(), 0, distractors=1)
    assert m.dropped == {"halve": "digits"}
    declared = next(t for t in m.tools if t.name == m.words["halve"]).parameters
    assert list(declared["properties"]) == [m.words["number"]] and declared["required"] == [m.words["number"]]
    b = TrajectoryBuilder("ep", tools=env.tools(), task=env.task("s", 0), meta={"env": {"name": "rounding"}})
    ctx = [b.message("system", env.system_prompt), b.message("user", "Halve 5.")]
    resp = b.message("assistant", "", tool_calls=[{"id": "t1", "name": "halve",
                                                   "arguments": {"number": 5, "digits": 1}}])
    b.call(ctx, resp)
    b.message("tool", env.step("halve", {"number": 5, "digits": 1}).observation, tool_call_id="t1", name="halve")
    parent = b.build()
    assert parent.messages[-1].content == "2.5"
    with pytest.raises(ValueError, match="removed argument"):
        augment_record(parent, m)
    child = augment_record(parent, m, env=AugmentedEnv(env, m))
    assert child.messages[-1].content == "2.0"
    assert child.messages[2].tool_calls[0].arguments == {m.words["number"]: 5}
    assert "digits" not in json.dumps(child.model_dump(mode="json"))


def test_augment_cli(env, tokenizer, tmp_path, kit):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app
    from memorywalker.records import TrajectoryReader, write_trajectories

    src = tmp_path / "expert.jsonl"
    write_trajectories(src, [run_episode(env, env.task("bridge", i), ExpertPolicy(), tokenizer, HarnessConfig("none"))
                             for i in range(2)])
    res = CliRunner().invoke(app, ["augment", str(src), "-o", str(tmp_path / "aug.jsonl"), "--copies", "2",
                                   "--tokenizer", str(kit[0]), "--no-progress"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["written"] == 4 and summary["rejected"] == 0 and summary["token_expansion"] > 1.0
    out = list(TrajectoryReader(tmp_path / "aug.jsonl"))
    assert [r.lineage.transform for r in out] == ["augment"] * 4
    assert len({tuple(t.name for t in r.tools) for r in out[:2]}) == 2  # each copy its own schema
