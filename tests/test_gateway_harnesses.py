"""Real Claude Code, Codex CLI and OpenCode (the pinned npm versions) through the gateway, offline.

Each harness runs one scripted session — read a file, run a command, write a file, show it, answer —
with its own auto-compaction moved low through its own setting, so the harness itself compacts. The
captured trajectory must hold the ≥ 4 tool calls, ≥ 1 summarize branch, and the exact methods must
reproduce its recorded logprobs at the fp32 floor while ``dfs`` does not after the compaction.

Slow (about a minute each) and needs the harnesses: ``npm install`` them (``.ci/run`` does) and set
``MEMORYWALKER_HARNESS_BIN`` to their ``node_modules/.bin``; skipped otherwise.
"""

from __future__ import annotations

from importlib import resources

import pytest

from conftest import load_script, require_harness
from memorywalker.gateway.harnesses import PINNED, capture

pytestmark = pytest.mark.slow

PROMPT = "Read notes.txt, list the files, write out.txt, then show it."
# Where each harness's own auto-compaction is set to trigger (prompt tokens of the kit tokenizer): above
# its first prompts and below the prompt its third tool call brings (scripts/harness_sessions.py).
COMPACT_AT = load_script("harness_sessions").COMPACT_AT


@pytest.mark.parametrize("harness", sorted(PINNED))
def test_real_harness_session_is_captured_and_trained_exactly(harness, kit, tmp_path):
    import torch

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.metrics.gap import gap_report
    from memorywalker.render import Renderer
    from memorywalker.train.model import load_model

    require_harness(harness)
    script = resources.files("memorywalker.data").joinpath(f"harness-scripts/{harness}.yaml")
    gw = build_gateway(str(kit[1]), f"scripted:{script}", tmp_path / "out", tokenizer=str(kit[0]),
                       harness=harness)
    s = capture(harness, PROMPT, gw, files={"notes.txt": "hello\n"}, deadline_s=300,
                compact_tokens=COMPACT_AT[harness])
    assert s.run.ok, s.run.stderr[-2000:]
    assert (s.run.workdir / "out.txt").read_text() == "hello from the agent\n"  # the harness ran the tools
    main = [t for t in s.trajectories if t.lineage.relation != "side"]
    assert len(main) == 1
    traj = main[0]
    tool_calls = [tc for c in traj.calls for tc in traj.message_table()[c.response].tool_calls]
    assert len(tool_calls) >= 4
    assert any(c.purpose == "summarize" for c in traj.calls)
    assert traj.meta["branches"].get("summarize", 0) >= 1
    assert all(c.context_tokens and c.rollout_logprobs for c in traj.calls)

    lm, tok = load_model(str(kit[1]), str(kit[0]), dtype="float32", device=torch.device("cpu"))
    report = gap_report(lm, Renderer(tok), [traj], ["radix", "tree-mask", "logit-tree", "dfs", "rightmost"],
                        drift=False)
    for m in ("radix", "tree-mask", "logit-tree"):
        assert report[m]["overall"]["logprob_abs_diff"] <= 1e-5, (m, report[m]["overall"])
    after = [report["dfs"]["by_branches"][b] for b in ("1", "2", "3+")]
    assert max(r["logprob_abs_diff"] or 0 for r in after) > 1e-4
    # rightmost keeps only what the last context still holds: fewer targets than the exact methods
    assert report["rightmost"]["overall"]["targets"] < report["radix"]["overall"]["targets"]


def test_eight_real_codex_sessions_at_once_never_mix(kit, tmp_path):
    """8 Codex processes at once through one gateway, each with its own notes.txt: 8 trajectories, each
    with the 4 tool calls and its own notes in its tool results, none with another's."""
    import threading

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.harnesses import run_harness
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.records import read_trajectories

    require_harness("codex")
    script = resources.files("memorywalker.data").joinpath("harness-scripts/codex.yaml")
    gw = build_gateway(str(kit[1]), f"scripted:{script}", tmp_path / "out", tokenizer=str(kit[0]),
                       harness="codex")
    runs = {}
    with BackgroundServer(gw) as url:
        def one(k: int) -> None:
            runs[k] = run_harness("codex", PROMPT, url=url, model="kit", files={"notes.txt": f"note number {k}\n"},
                                  deadline_s=600)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(r.ok for r in runs.values()), [r.stderr[-500:] for r in runs.values() if not r.ok]
    trajs = read_trajectories(tmp_path / "out" / "trajectories.jsonl")
    assert len(trajs) == 8 and len({t.id for t in trajs}) == 8
    seen = set()
    for t in trajs:
        results = " ".join(m.content for m in t.messages if m.role == "tool")
        mine = [k for k in range(8) if f"note number {k}" in results]
        assert len(mine) == 1, results[:300]
        seen.add(mine[0])
        assert sum(len(t.message_table()[c.response].tool_calls) for c in t.calls) == 4
    assert seen == set(range(8))
