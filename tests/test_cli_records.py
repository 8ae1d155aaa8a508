"""`memorywalker schema | validate | inspect` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.cli.records_cmd import _example_path
from memorywalker.records import SCHEMA_VERSION

runner = CliRunner()
DATA = Path(__file__).parent / "data"


def test_schema_prints_json_schema():
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["$id"] == SCHEMA_VERSION


def test_inspect_json_keys_and_totals(kit, tmp_path, monkeypatch):
    """Totals are sums over trajectories; ratios are recomputed from the sums."""
    res = runner.invoke(app, ["inspect", str(_example_path()), "--tokenizer", str(kit[0]), "--json",
                              "--max-length", "1024"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) == {"file", "read", "trajectories", "total", "occupancy", "context_check"}
    per, total = out["trajectories"], out["total"]
    assert [t["evictions"] for t in per] == [0, 1, 2]
    assert [t["segments"] for t in per] == [1, 2, 3]
    for key in ("calls", "unique_tokens", "per_call_tokens", "logit_tree_tokens", "targets"):
        assert total[key] == sum(t[key] for t in per)
    assert total["p_over_u"] == total["per_call_tokens"] / total["unique_tokens"]
    assert total["zero_target_calls"] == {"not_selected: refused proposal": 1, "truncated": 1}
    assert out["read"] == {"read": 3, "accepted": 3, "rejected": 0, "by_reason": {}}
    assert out["occupancy"]["max_length"] == 1024 and out["occupancy"]["overlong"] == 0
    # the bundled example records no billed tokens: every call unchecked
    assert out["context_check"] == {"verified": 0, "unverified": 0, "unchecked": total["calls"]}


def test_inspect_table_and_rejects_file(kit, tmp_path):
    bad = tmp_path / "mixed.jsonl"
    bad.write_text(_example_path().read_text() + "{oops\n")
    rejects = tmp_path / "rejects.jsonl"
    res = runner.invoke(app, ["inspect", str(bad), "--tokenizer", str(kit[0]), "--rejects", str(rejects)])
    assert res.exit_code == 0, res.output
    assert "read 4 = accepted 3 + rejected 1 (bad_json=1)" in res.output
    assert json.loads(rejects.read_text())["reason"] == "bad_json"


def test_validate_reports_counts(tmp_path):
    f = tmp_path / "v.jsonl"
    f.write_bytes((DATA / "valid_record.json").read_bytes() + (DATA / "bad_records" / "no_calls.jsonl").read_bytes())
    res = runner.invoke(app, ["validate", str(f), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"read": 2, "accepted": 1, "rejected": 1, "by_reason": {"no_calls": 1}}


def test_unknown_option_fails_loudly():
    res = runner.invoke(app, ["inspect", "--no-such-option"])
    assert res.exit_code != 0
