"""`memorywalker view` in a real headless Chromium: the 218-call compacted Claude Code session and a
demo episode with a per-token gap heat map.

Chromium comes from the Debian package (installed here when missing; the tests skip with the reason
when it cannot be). Screenshots are written to ``$MEMORYWALKER_TEST_ARTIFACTS`` (default
``test-artifacts/`` at the repository root).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from engine_cases import with_rollout_logprobs
from memorywalker.cli.main import app
from memorywalker.importers import run_import
from memorywalker.records import write_trajectories
from memorywalker.render import Renderer
from memorywalker.rollout import ExpertPolicy, HarnessConfig, WebSearchEnv, rollout
from memorywalker.viewer import page_html, view_data

SESSION = "ae4a77f8-aedd-4bc1-888f-c94edc91af04"
ARTIFACTS = Path(os.environ.get("MEMORYWALKER_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))
ROW_CHUNK, MSG_CHUNK = 40, 60  # the page's lazy-rendering chunk sizes


@pytest.fixture(scope="module")
def browser():
    from chromium import Browser, chromium_binary

    pytest.importorskip("websocket", reason="websocket-client (dev extra) is needed to drive Chromium")
    binary, why = chromium_binary()
    if binary is None:
        pytest.skip(why)
    b = Browser(binary)
    yield b
    b.close()


def _view(args: list[str]) -> None:
    r = CliRunner().invoke(app, ["view", *args])
    assert r.exit_code == 0, r.output


def _scroll_to_end(browser, n_calls: int) -> None:
    for _ in range(n_calls // ROW_CHUNK + 2):
        browser.eval("document.getElementById('sentinel').scrollIntoView()")
        browser.eval("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")


def test_page_is_offline_and_escapes_script_end():
    """No external URL in the page; a message containing </script> cannot end the data block."""
    from memorywalker.records import TrajectoryBuilder

    b = TrajectoryBuilder("t/1")
    s = b.message("system", "</script><script>alert(1)</script>")
    b.call([s], b.message("assistant", "ok"))
    page = page_html(view_data(b.build()))
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert page.count("</script>") == 2  # the data block's and the code block's own ends


def test_viewer_on_the_compacted_claude_code_session(browser, harness_logs, tmp_path):
    """218 calls, one manual compaction: two segments, one eviction marker before the first call that
    follows the compaction; rows and contexts are built lazily; a click opens a call's context."""
    result = run_import("claude-code", [harness_logs / "claude-code" / f"{SESSION}.jsonl"])
    traj = next(t for t in result.trajectories if t.id == SESSION)
    assert len(traj.calls) == 218 and len(traj.evictions) == 1
    data = tmp_path / "cc.jsonl"
    write_trajectories(data, result.trajectories)
    _view([str(data), "--id", SESSION, "-o", str(tmp_path / "view")])
    page = tmp_path / "view" / f"{SESSION}.html"

    seconds = browser.goto(page.as_uri())
    assert seconds < 10
    summary = browser.eval("Object.assign({}, document.getElementById('summary').dataset)")
    assert summary == {"calls": "218", "segments": "2", "evictions": "1"}
    assert browser.eval("document.querySelectorAll('rect.bar').length") == 218
    # Lazy: only the first chunk of rows exists, and no context message is in the DOM yet.
    assert browser.eval("document.querySelectorAll('.call').length") == ROW_CHUNK
    assert browser.eval("document.querySelectorAll('.msg').length") == 0

    _scroll_to_end(browser, 218)
    assert browser.eval("document.querySelectorAll('.call').length") == 218
    ev = traj.evictions[0]
    at = [c.id for c in traj.calls].index(ev.before_call)
    markers = browser.eval("[...document.querySelectorAll('.evict-marker')].map(e => [+e.dataset.call, e.textContent])")
    assert len(markers) == 1 and markers[0][0] == at
    assert f"{len(ev.removed)} messages removed, {len(ev.inserted)} inserted" in markers[0][1]
    # The marker sits between the last call of segment 0 and the first of segment 1.
    order = browser.eval("[...document.querySelectorAll('.evict-marker, .call')].map(e => e.className.split(' ')[0] + e.dataset.call)")
    assert order[at: at + 2] == [f"evict-marker{at}", f"call{at}"]

    browser.click(".evict-marker b")
    shown = browser.eval("[...document.querySelectorAll('.evict-marker .msg')].map(e => +e.dataset.msg)")
    index = {m.id: i for i, m in enumerate(traj.messages)}
    assert shown == [index[m] for m in ev.removed[:MSG_CHUNK]] + [index[m] for m in ev.inserted[:MSG_CHUNK]]

    # Click a call after the compaction: its delivered context (first chunk) and its response.
    i = at + 3
    call = traj.calls[i]
    browser.click(f"#call-{i} .call-head")
    msgs = browser.eval(f"[...document.querySelectorAll('#call-{i} .call-body > .msg:not(.response)')].map(e => +e.dataset.msg)")
    assert msgs == [index[m] for m in call.context[:MSG_CHUNK]]
    assert browser.eval(f"document.querySelector('#call-{i} .msg.role-artifact') !== null")  # the summary
    target = browser.eval(f"document.querySelector('#call-{i} .response .target').textContent")
    from memorywalker.viewer import message_text

    assert target == message_text(traj.message_table()[call.response])
    browser.eval(f"document.getElementById('call-{i}').scrollIntoView()")
    browser.screenshot(ARTIFACTS / "viewer-claude-code-218.png")
    browser.click(f"#call-{i} .call-head")  # a second click closes it
    assert browser.eval(f"document.querySelectorAll('#call-{i} .msg').length") == 0


@pytest.fixture(scope="module")
def demo_episode(kit, tokenizer):
    """One expert demo episode under opencode pruning with rollout logprobs from the kit model's plain
    causal forward of each S_t (what a rollout engine records)."""
    model = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    trajs, _ = rollout(WebSearchEnv(), ExpertPolicy(), tokenizer, HarnessConfig(name="opencode", budget=700),
                       suite="lookup", n=1, seed=0)
    traj = trajs[0]
    assert traj.evictions
    renderer = Renderer(tokenizer)
    return with_rollout_logprobs(model, renderer, traj), renderer.render(traj)


def test_viewer_on_a_demo_episode_with_gap_heat_map(browser, demo_episode, kit, tmp_path):
    """`gap --json --per-token` then `view --gap`: every target token is drawn with its |Δlogp|.
    tree-mask is exact (every value ≤ 1e-5); dfs is exact before the first eviction and not after."""
    traj, rt = demo_episode
    data = tmp_path / "demo.jsonl"
    write_trajectories(data, [traj])
    gap = tmp_path / "gap.json"
    r = CliRunner().invoke(app, ["gap", "--model", kit[1], "--data", str(data), "--method", "tree-mask",
                                 "--method", "dfs", "--no-drift", "--json", "--per-token"])
    assert r.exit_code == 0, r.output
    gap.write_text(r.stdout)
    _view([str(data), "--gap", str(gap), "--tokenizer", kit[0], "-o", str(tmp_path / "view")])
    browser.goto((tmp_path / "view" / f"{traj.id}.html").as_uri())

    assert browser.eval("document.getElementById('summary').dataset.calls") == str(len(traj.calls))
    first_ev = min([c.id for c in traj.calls].index(e.before_call) for e in traj.evictions)
    last = len(traj.calls) - 1
    assert last >= first_ev
    assert browser.eval("[...document.querySelectorAll('input[name=method]')].map(e => e.value)") == ["dfs", "tree-mask"]
    browser.click("#m-tree-mask")
    for i in (0, last):
        browser.click(f"#call-{i} .call-head")
        toks = browser.eval(f"[...document.querySelectorAll('#call-{i} .response .tok')].map(e => e.textContent)")
        assert len(toks) == len(rt.calls[i].tokens) - rt.calls[i].prompt_len
        n_targets = len(rt.calls[i].targets)
        assert browser.eval(f"document.querySelectorAll('#call-{i} .response .tok.target').length") == n_targets
        diffs = browser.eval(f"[...document.querySelectorAll('#call-{i} .response .tok.target')].map(e => +e.dataset.diff)")
        assert len(diffs) == n_targets and max(diffs) <= 1e-5, ("tree-mask", i)
    browser.click("#m-dfs")
    dfs_first = browser.eval("[...document.querySelectorAll('#call-0 .response .tok.target')].map(e => +e.dataset.diff)")
    dfs_last = browser.eval(f"[...document.querySelectorAll('#call-{last} .response .tok.target')].map(e => +e.dataset.diff)")
    assert max(dfs_first) <= 1e-5  # before any eviction dfs conditions exactly like the rollout
    assert max(dfs_last) > 1e-3  # after evictions it sees the raw text that was evicted
    report = json.loads(gap.read_text())
    # The page shows the report's numbers: |logp - rollout| of the last call's first target.
    row = report["tokens"][traj.id][traj.calls[last].id]
    assert dfs_last[0] == pytest.approx(abs(row["logprob"]["dfs"][0] - row["rollout"][0]), rel=1e-6)
    browser.eval(f"document.getElementById('call-{last}').scrollIntoView()")
    browser.screenshot(ARTIFACTS / "viewer-demo-gap.png")
