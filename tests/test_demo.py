"""The demo on a very small fixed-seed run: the relations the README reports that do not need a trained model.

At this size the models are barely trained, so reward is not asserted (the README's numbers come from
the full run). What follows from how each method conditions the targets is: the exact methods sit at the
floor after any number of branches; dfs conditions the calls before the first branch like the rollout
(floor) and the later ones on evicted text (well above it, more so after 2+ branches).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from memorywalker.metrics.report import REFERENCE, claims, results_table
from memorywalker.recipes.demo import METHODS, QUICK, run_demo
from memorywalker.recipes.warm import copy_check, summary_call_records
from memorywalker.records import check_trajectory
from memorywalker.rollout import HarnessConfig, VaultEnv, VaultExpert, rollout

TINY = replace(QUICK, hidden_size=64, num_layers=2, pretrain_steps=4, pretrain_far_steps=2, warm_episodes=8, warm_summaries=2, warm_steps=2,
               warm_check_every=1, warm_check_episodes=2, warm_copy_target=0.0, warm_summary_target=0.0,
               sft_episodes=8, sft_steps=2, rl_steps=1, rl_prompts=1, rl_group=2, eval_tasks=2, max_steps=3,
               max_new_tokens=24, methods=("radix", *METHODS), rl_methods=("radix", "tree-mask", "dfs", "rightmost"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    doc = run_demo(TINY, out, progress=False, log=lambda s: None)
    return out, doc


def test_outputs_are_written(demo):
    out, doc = demo
    saved = json.loads((out / "results.json").read_text())
    assert list(saved["methods"]) == list(TINY.methods)
    for m, r in saved["methods"].items():
        stages = ("sft", "rl") if m in TINY.rl_methods else ("sft",)
        assert [s for s in ("sft", "rl", "rl_steps") if s in r] == [*stages, *(["rl_steps"] if "rl" in stages else [])]
        assert list(r["seconds"]) == [f"{s}{e}" for s in map(str.upper, stages) for e in ("", " eval")]
        for stage in stages:
            for h in TINY.harnesses:
                ev = r[stage][h]
                assert len(ev["rewards"]) == TINY.eval_tasks and all(0.0 <= x <= 1.0 for x in ev["rewards"])
        if "rl" in stages:
            assert len(r["rl_steps"]["reward_mean"]) == TINY.rl_steps
    assert list(saved["stage_seconds"]) == ["kit", "pretraining", "expert episodes", "warm start",
                                            "methods (side by side)", "report"]
    # each stage and the total are rounded to 0.1 s: their sum may pass the total by up to 0.05 s a term
    assert sum(saved["stage_seconds"].values()) <= saved["seconds_total"] + 0.05 * (len(saved["stage_seconds"]) + 1)
    for name in ("reward.png", "gap_by_branches.png", "gap_over_steps.png", "index.html", "table.md"):
        assert (out / name).stat().st_size > 0
    assert (out / "table.md").read_text().strip() == results_table(doc).strip()


def test_a_method_without_grpo_has_its_sft_row_and_dashes(demo):
    """sdcc is not in TINY's rl_methods: its reward rows show the SFT mean and "—" for the RL cells, its
    gap row is its SFT model's, and the conclusions need no RL of it."""
    _, doc = demo
    table = results_table(doc)
    for h in TINY.harnesses:
        row = doc["summary"][h]["sdcc"]
        assert set(row) == {"sft", f"sft_vs_{REFERENCE}"}
        assert f"| `sdcc` | {row['sft'][0]:.3f} [" in table
    assert table.count("| `sdcc` |") == 3 and "| `sdcc` | SFT |" in table
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
             if line.startswith("| `sdcc` |") and "SFT" not in line]
    assert len(cells) == 2 and all([c[2], c[3], c[5]] == ["—"] * 3 for c in cells)  # after RL, RL − SFT, RL − ref


def test_warm_start_runs_every_step_and_checks_act_calls_and_summaries(demo):
    """The warm start is not stopped by its checks: TINY's targets are 0, so its first check passes, and
    it still runs its 2 steps, a check after each (check_every 1), each ``[step, act calls, summaries]``
    with accuracies in [0, 1]; the table's verdict says it copies (every target met)."""
    _, doc = demo
    checks = doc["warm_copy_checks"]
    assert doc["warm_steps"] == TINY.warm_steps == 2 and [c[0] for c in checks] == [1, 2]
    assert all(len(c) == 3 and all(0.0 <= a <= 1.0 for a in c[1:]) for c in checks)
    assert next(c for c in claims(doc) if c["claim"] == "the warm start copies")["holds"]


def test_summary_intervals_are_paired_bootstraps_of_the_rewards(demo):
    """The SFT row's mean is the mean of its per-task rewards and lies inside its interval; the difference
    against tree-mask has the mean of the per-task differences."""
    _, doc = demo
    for h in TINY.harnesses:
        for m, row in doc["summary"][h].items():
            rewards = doc["methods"][m]["sft"][h]["rewards"]
            mean, low, high = row["sft"]
            assert math.isclose(mean, sum(rewards) / len(rewards)) and low <= mean <= high
            if m != REFERENCE:
                ref = doc["methods"][REFERENCE]["sft"][h]["rewards"]
                diff = [a - b for a, b in zip(rewards, ref, strict=True)]
                assert math.isclose(row["sft_vs_" + REFERENCE][0], sum(diff) / len(diff), abs_tol=1e-12)


def test_exact_methods_stay_at_the_floor(demo):
    _, doc = demo
    for m in ("radix", "tree-mask"):
        for h in TINY.harnesses:
            r = doc["methods"][m]["rl"][h]
            assert r["gap"] < 1e-5, (m, h)
            assert all(v is None or v < 1e-5 for v in r["gap_by_branches"].values()), (m, h)


def test_dfs_gap_is_at_the_floor_before_the_first_branch_and_well_above_it_after(demo):
    _, doc = demo
    for h in TINY.harnesses:
        dfs = doc["methods"]["dfs"]["rl"][h]
        assert dfs["gap_floor"] < 1e-5, h  # before any branch dfs conditions like the rollout
        assert dfs["gap"] > 1e-3, h


def test_methods_side_by_side_give_the_numbers_of_one_process(demo, tmp_path):
    """The fixture ran the methods in 2 worker processes; run here one after the other in this process,
    every number (rewards, gaps, losses, step metrics) is the same: each method's stages depend only on
    the warm start and the seed, and run with one torch thread wherever they run."""
    _, doc = demo
    assert TINY.workers == 2
    alone = run_demo(replace(TINY, workers=1, methods=("tree-mask", "sdcc")), tmp_path, progress=False,
                     log=lambda s: None)
    for m in ("tree-mask", "sdcc"):
        assert ("rl" in alone["methods"][m]) == (m in TINY.rl_methods)
        for key in (k for k in ("sft", "rl", "sft_loss", "rl_steps") if k in alone["methods"][m]):
            assert json.dumps(alone["methods"][m][key]) == json.dumps(doc["methods"][m][key]), (m, key)


def test_summary_call_records_are_the_summarization_calls_as_delivered(tokenizer, renderer):
    """Under claude-code at budget 260 the expert compacts before every act call (test_vault), so a
    recall-3 episode has >= 2 summarize calls; each becomes a valid one-call record, child of the episode,
    whose rendering is token for token the call as it was delivered, targets included."""
    episodes, _ = rollout(VaultEnv(0), VaultExpert(), tokenizer, HarnessConfig("claude-code", budget=260),
                          suite="recall-3", n=2, seed=0, split="train")
    for t in episodes:
        summarize = [i for i, c in enumerate(t.calls) if c.purpose == "summarize"]
        records = summary_call_records(t)
        assert len(records) == len(summarize) >= 2
        whole = renderer.render(t)
        for rec, i in zip(records, summarize, strict=True):
            check_trajectory(rec, vocab_size=len(tokenizer))
            assert len(rec.calls) == 1 and not rec.evictions and rec.lineage.parent == t.id
            one = renderer.render(rec).calls[0]
            assert one.targets and (one.tokens, one.targets) == (whole.calls[i].tokens, whole.calls[i].targets)


class _Predicts(torch.nn.Module):
    """Logits that put all mass on ``pick(input_ids)[i]`` at position ``i`` (a stand-in model)."""

    def __init__(self, vocab: int, pick):
        super().__init__()
        self.vocab, self.pick = vocab, pick

    def forward(self, input_ids):
        return SimpleNamespace(logits=torch.nn.functional.one_hot(self.pick(input_ids), self.vocab).float())


def test_copy_check_scores_the_code_tokens_of_the_responses(tmp_path):
    """On two expert episodes (uncompressed, recall-2), with a tokenizer that keeps the codes whole: a model
    that predicts each next token exactly scores 1; one that repeats the current token scores 0 (a code
    never follows itself); one that always says the first code written scores the share of that code
    among the code words of the responses (their text and tool-call arguments; no tokens involved), and
    with ``words`` = names and codes its share among those words written after a space (a tool call's
    argument follows a quote, so it is not scored)."""
    from transformers import AutoTokenizer

    from memorywalker.modelkit import build_tokenizer, bundled_corpus
    from memorywalker.rollout.environments.vault.env import CODES, NAMES

    env = VaultEnv(0)
    tok = AutoTokenizer.from_pretrained(build_tokenizer(tmp_path / "tok", bundled_corpus() + env.corpus()))
    episodes, _ = rollout(env, VaultExpert(), tok, HarnessConfig("none"), suite="recall-2", n=2, seed=0, split="test")
    responses = [t.message_table()[c.response] for t in episodes for c in t.calls]
    text = " ".join(m.content + " ".join(json.dumps(tc.arguments) for tc in m.tool_calls) for m in responses)
    said = [w for w in re.findall(r"\w+", text) if w in CODES]
    code = said[0]
    (one,) = tok(" " + code, add_special_tokens=False)["input_ids"]
    V = len(tok)
    oracle = _Predicts(V, lambda ids: torch.cat([ids[:, 1:], ids[:, -1:]], 1))
    same = _Predicts(V, lambda ids: ids)
    constant = _Predicts(V, lambda ids: torch.full_like(ids, one))
    assert copy_check(oracle, tok, episodes) == 1.0
    assert copy_check(same, tok, episodes) == 0.0
    assert len(said) >= 4 and copy_check(constant, tok, episodes) == pytest.approx(said.count(code) / len(said))
    spaced = [w for w in re.findall(r"(?<= )\w+", text) if w in CODES or w in NAMES]
    assert len(spaced) > len(said) and all(len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1
                                           for w in spaced)
    assert copy_check(constant, tok, episodes, (*NAMES, *CODES)) == pytest.approx(spaced.count(code) / len(spaced))


def test_check_readme_judges_a_finished_run_by_the_headline(demo, tmp_path):
    """``demo --check-readme R --results DIR`` judges the fixture's run without rerunning it: against a
    headline of that one run it passes (exit 0); against one that says a conclusion the run fails held on
    every run, and that tree-mask's SFT mean sat 0.5 above this run's interval, it names both (exit 1, one
    line on stderr; each conclusion the run fails is named too); --results without --check-readme and a README without the block are usage errors."""
    from typer.testing import CliRunner

    from memorywalker.cli.main import app
    from memorywalker.metrics.seeds import headline, run_summary

    out, doc = demo
    runner = CliRunner()
    summary = run_summary(doc)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n<!-- demo-seeds:quick begin -->\n{headline([summary])}\n<!-- demo-seeds:quick end -->\n")
    ok = runner.invoke(app, ["demo", "--quick", "--check-readme", str(readme), "--results", str(out)])
    assert ok.exit_code == 0, ok.output
    assert "every conclusion that holds on every run there holds here" in ok.output
    failing = sum(not c["holds"] for c in summary["claims"])  # each held on "every run" of the edited headline
    other = json.loads(json.dumps(summary))
    h = TINY.harnesses[0]
    mean, low, high = other["reward"][h][REFERENCE]["sft"]
    other["reward"][h][REFERENCE]["sft"] = [high + 0.5, high + 0.5, high + 0.5]
    for c in other["claims"]:
        c["holds"] = True
    readme.write_text(f"<!-- demo-seeds:quick begin -->\n{headline([other])}\n<!-- demo-seeds:quick end -->\n")
    bad = runner.invoke(app, ["demo", "--quick", "--check-readme", str(readme), "--results", str(out / "results.json")])
    assert bad.exit_code == 1
    lines = [line.strip() for line in bad.output.splitlines() if line.startswith("  ")]
    assert len(lines) == failing + 1
    assert lines[-1].startswith(f"{h}, {REFERENCE} after SFT: {mean:.3f} [{low:.3f}, {high:.3f}] here, outside")
    usage = runner.invoke(app, ["demo", "--results", str(out)])
    assert usage.exit_code == 2 and "--check-readme" in usage.output
    readme.write_text("no block\n")
    missing = runner.invoke(app, ["demo", "--quick", "--check-readme", str(readme), "--results", str(out)])
    assert missing.exit_code == 2 and "demo-seeds:quick" in missing.output


def test_seeds_write_each_run_and_the_headline_over_them(tmp_path):
    """``demo --seeds 2`` (run_seeds): one directory per seed, ``seeds.json`` holding each run's summary
    (seeds 3 and 4, in order, each the summary of its own results.json) and ``seeds.md`` the headline over
    them, which says over how many runs each conclusion holds."""
    from memorywalker.metrics.seeds import headline, run_summary
    from memorywalker.recipes.demo import run_seeds

    cfg = replace(TINY, seed=3, methods=("tree-mask", "dfs"), rl_methods=("tree-mask",))
    docs = run_seeds(cfg, tmp_path, 2, progress=False, log=lambda s: None)
    runs = json.loads((tmp_path / "seeds.json").read_text())["runs"]
    assert [r["seed"] for r in runs] == [3, 4] == [d["config"]["seed"] for d in docs]
    for r, seed in zip(runs, (3, 4), strict=True):
        saved = json.loads((tmp_path / f"seed-{seed}" / "results.json").read_text())
        assert r == json.loads(json.dumps(run_summary(saved)))
    assert (tmp_path / "seeds.md").read_text() == headline(runs) + "\n"
    assert all(" of 2 runs |" in line for line in headline(runs).splitlines()[4:4 + len(runs[0]["claims"])])
