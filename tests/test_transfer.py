"""Transfer regimes: a policy that recalls the original tool names solves familiar schemas and fails on renamed
ones (every proposal an undeclared tool), which is what the regimes separate."""

from __future__ import annotations

import pytest

from memorywalker.eval.evaluate import Candidate, EvalConfig
from memorywalker.eval.transfer import paired, per_task_sfa, regimes, report, transfer_rows
from memorywalker.rollout import ExpertPolicy, WebSearchEnv

SMALL = {"n_cities": 2, "n_companies": 3, "n_people": 3, "n_distractors": 2}


def test_regimes_report_reward_sfa_pre(tokenizer, tmp_path):
    cfg = EvalConfig(suites=("lookup",), n=2, world_size=SMALL, max_steps=6)
    rows = transfer_rows(Candidate("expert", ExpertPolicy(), tokenizer, {}), cfg, tmp_path)
    rep = report(rows)
    assert set(rep) == {"new-tasks", "renamed-schema", "unfamiliar-tools"}
    assert rep["new-tasks"]["acceptance"] == 1.0 and rep["new-tasks"]["sfa"] == 1.0 and rep["new-tasks"]["pre"] == 0.0
    for r in ("renamed-schema", "unfamiliar-tools"):  # old names: undeclared, 6 steps each, never answered
        assert rep[r]["acceptance"] == 0.0 and rep[r]["sfa"] == 0.0
        assert rep[r]["validity"]["undeclared_tool"] == rep[r]["proposals"] == 2 * 6
    assert {x["task"] for x in rows["renamed-schema"]["lookup"]} != {x["task"] for x in rows["new-tasks"]["lookup"]}
    with pytest.raises(ValueError):  # different task sets (test vs train split): nothing to pair
        paired(rows["new-tasks"]["lookup"], rows["renamed-schema"]["lookup"], alpha=0.05)
    same = paired(rows["new-tasks"]["lookup"], rows["new-tasks"]["lookup"], alpha=0.05)
    assert same["sfa"]["difference"] == 0.0 and per_task_sfa(rows["new-tasks"]["lookup"]) == {
        x["task"]: 1.0 for x in rows["new-tasks"]["lookup"]}
    env = WebSearchEnv(0, world_size=SMALL)
    assert len(regimes(env)["unfamiliar-tools"][0].tools()) == 3 + 4
