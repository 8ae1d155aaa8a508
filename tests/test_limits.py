"""Hostile records never reach a model (issue 27, failures 1, 4, 7 and 9): out-of-vocabulary token ids,
deep nesting and over-long calls are set aside with their reason, before anything is written or run;
the records around them are kept; ``inspect`` fails on a file with nothing to inspect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.records import RecordLimits, TrajectoryReader
from memorywalker.records.limits import nesting_depth
from memorywalker.records.validate import RecordError
from memorywalker.train.inputs import FitsModel, model_positions

runner = CliRunner()


def good(i: int) -> dict:
    return synthetic_trajectory(SyntheticSpec(turns=2, evictions=0, words=4, seed=i), f"ok-{i}").to_json_dict()


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def rejects_of(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


# --- 1. out-of-vocabulary ids --------------------------------------------------------------------------

def with_tokens(i: int, bad: int) -> dict:
    """A record with recorded tokens whose third response token is ``bad`` (the reproducer's edit)."""
    rec = good(i)
    rec["id"] = f"oov-{i}"
    rec["calls"][0].update(context_tokens=[1, 2, 3], response_tokens=[4, 5, bad])
    return rec


def test_sft_sets_out_of_vocabulary_records_aside_and_trains_on_the_rest(tmp_path, kit, tokenizer):
    """Old code: `IndexError: index out of range in self (a bug?)`, exit 1, after step 0 and config.json
    (-1 or 2**70: OverflowError). Now the three records are rejected (token_out_of_vocab, the id and the
    vocabulary size named) before the model loads, and the two good ones train: read 5 = 2 + 3."""
    data = write(tmp_path / "oov.jsonl", [good(0), with_tokens(1, 10**6), with_tokens(2, -1), with_tokens(3, 2**70),
                                          good(4)])
    run = tmp_path / "run"
    res = runner.invoke(app, ["sft", f"data={data}", f"model={kit[1]}", f"tokenizer={kit[0]}", f"run_dir={run}",
                              "steps=2", "batch_size=2", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "read 5 = accepted 2 + rejected 3 (token_out_of_vocab=3)" in res.output
    rejects = rejects_of(run / "rejects.rank0.jsonl")
    assert [(r["line"], r["reason"]) for r in rejects] == [(n, "token_out_of_vocab") for n in (2, 3, 4)]
    for r, bad in zip(rejects, (10**6, -1, 2**70), strict=True):
        assert f"response_tokens has id {bad} (vocab size {len(tokenizer)})" in r["message"]
    assert [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]


# --- 4. deep nesting --------------------------------------------------------------------------------------

def deep_file(tmp_path) -> Path:
    """The reproducer's line ('[' * 100000), a record whose tool arguments nest 5,000 levels, one that
    nests 150 (under the recursion limit, over max_depth 100), and one good record."""
    nested = good(1)
    nested["messages"][2]["tool_calls"][0]["arguments"] = {"q": "__DEEP__"}
    line = json.dumps(nested).replace('"__DEEP__"', "[" * 5000 + "]" * 5000)
    mid = good(2)
    mid["messages"][2]["tool_calls"][0]["arguments"] = {"q": json.loads("[" * 150 + "]" * 150)}
    return write(tmp_path / "n.jsonl", ["[" * 100000 + "]" * 100000, line, mid, good(0)])


@pytest.mark.parametrize("command", ["validate", "inspect", "export", "view", "gap", "sft"])
def test_deep_nesting_is_rejected_in_every_reading_command(tmp_path, kit, command):
    """Old code: `RecursionError (a bug?)`, exit 1, in all six. Now every deep line is one too_deep
    reject (read 4 = accepted 1 + rejected 3) and the command goes on with the good record."""
    data = deep_file(tmp_path)
    args = {
        "validate": ["validate", str(data)],
        "inspect": ["inspect", str(data), "--tokenizer", str(kit[0])],
        "export": ["export", str(data), "--format", "trl", "-o", str(tmp_path / "exp")],
        "view": ["view", str(data), "-o", str(tmp_path / "view")],
        "gap": ["gap", "--model", str(kit[1]), "--tokenizer", str(kit[0]), "--data", str(data),
                "--rejects", str(tmp_path / "rej.jsonl")],
        "sft": ["sft", f"data={data}", f"model={kit[1]}", f"tokenizer={kit[0]}", f"run_dir={tmp_path / 'run'}",
                "steps=1", "batch_size=1", "--no-progress"],
    }[command]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "RecursionError" not in res.output and "a bug" not in res.output
    if command in ("validate", "inspect", "export", "gap", "sft"):
        assert "read 4 = accepted 1 + rejected 3 (too_deep=3)" in " ".join(res.output.split())


def test_nesting_depth_and_the_configured_limits(tmp_path, monkeypatch):
    """Depth: a scalar 0, ``[]`` 1; the walk stops one past the limit. The good record nests 6 levels
    (record, messages, message, tool_calls, call, arguments): MEMORYWALKER_MAX_RECORD_DEPTH=6 accepts
    it, 5 rejects it as too_deep; MEMORYWALKER_MAX_RECORD_BYTES at its length accepts it, one byte
    less rejects it as record_too_large."""
    assert nesting_depth(1, 10) == 0 and nesting_depth([], 10) == 1 and nesting_depth([[[[]]]], 2) == 3
    assert nesting_depth(good(0), 100) == 6
    data = write(tmp_path / "one.jsonl", [good(0)])
    size = len(data.read_bytes()) - 1
    for env, value, reason in (("MEMORYWALKER_MAX_RECORD_DEPTH", "6", None), ("MEMORYWALKER_MAX_RECORD_DEPTH", "5", "too_deep"),
                               ("MEMORYWALKER_MAX_RECORD_BYTES", str(size), None),
                               ("MEMORYWALKER_MAX_RECORD_BYTES", str(size - 1), "record_too_large")):
        monkeypatch.setenv(env, value)
        reader = TrajectoryReader(data)
        list(reader)
        assert reader.summary.by_reason == ({reason: 1} if reason else {}), (env, value)
        monkeypatch.delenv(env)
    monkeypatch.setenv("MEMORYWALKER_MAX_RECORD_BYTES", "lots")
    with pytest.raises(ValueError, match="MEMORYWALKER_MAX_RECORD_BYTES='lots': not an integer"):
        RecordLimits.from_env()


def test_a_line_over_the_size_limit_is_skipped_not_held(tmp_path):
    """A 50 MB line (old code: inspect > 120 s) is rejected as record_too_large without being read
    into memory whole (the reader keeps its first 4 KiB for the rejects file) and the next line is
    read normally."""
    data = tmp_path / "big.jsonl"
    head, tail = '{"schema": "memorywalker.trajectory/v1", "id": "big", "x": "', '"}'
    size = len(head) + (50 << 20) + len(tail)  # bytes of the line without its newline
    with open(data, "w") as f:
        f.write(head + "a" * (50 << 20) + tail + "\n")
        f.write(json.dumps(good(0)) + "\n")
    reader = TrajectoryReader(data, rejects_path=tmp_path / "rej.jsonl")
    assert [t.id for t in reader] == ["ok-0"]
    (row,) = rejects_of(tmp_path / "rej.jsonl")
    assert row["reason"] == "record_too_large" and row["message"].startswith(f"{size:,} bytes, more than max_bytes")
    assert len(row["raw"]) < 5000 and row["raw"].endswith(f"[cut: the line has {size:,} bytes]")


def test_inspect_a_50mb_line_is_one_reject(tmp_path, kit):
    data = tmp_path / "big.jsonl"
    data.write_text('{"schema": "memorywalker.trajectory/v1", "id": "big", "messages": [{"id": "m", "role": "user", '
                    '"content": "' + "word " * (10 << 20) + '"}], "calls": []}\n' + json.dumps(good(0)) + "\n")
    res = runner.invoke(app, ["inspect", str(data), "--tokenizer", str(kit[0]), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["read"]["by_reason"] == {"record_too_large": 1}


# --- 7. over-long calls --------------------------------------------------------------------------------

def test_fits_model_rejects_a_call_longer_than_the_positions(renderer):
    """The check compares the longest call's S_t with the positions: equal passes, one fewer rejects,
    with the call and both numbers in the message."""
    traj = synthetic_trajectory(SyntheticSpec(turns=3, evictions=1, words=6, seed=0), "t")
    lengths = [len(c.tokens) for c in renderer.render(traj).calls]
    longest = max(lengths)
    FitsModel(renderer, longest)(traj)
    with pytest.raises(RecordError) as e:
        FitsModel(renderer, longest - 1)(traj)
    call = traj.calls[lengths.index(longest)].id
    assert e.value.code == "too_long"
    assert e.value.message == f"call {call!r} renders to {longest:,} tokens; the model has {longest - 1:,} positions (max_seq_len)"


def test_sft_sets_a_1mb_message_aside_before_any_forward(tmp_path, kit):
    """Old code: a 1 MB user message (~580K kit tokens against the kit's positions) ran sft > 150 s with no
    output. Now it is rejected as too_long (the kit model has 65,536 positions, read from its config)
    and the other records train."""
    from memorywalker.recipes.sft import SFTConfig, train

    assert model_positions(kit[1]) == 65_536 and model_positions("kit") == 65_536
    long = good(9)
    long["messages"][1]["content"] = " ".join(f"w{i % 997}" for i in range(200_000))[: 1 << 20]
    data = write(tmp_path / "long.jsonl", [good(0), long, good(1)])
    run = tmp_path / "run"
    result = train(SFTConfig(model=str(kit[1]), tokenizer=str(kit[0]), data=str(data), run_dir=str(run), steps=1,
                             batch_size=2), progress=False)
    assert result.steps == 1
    (row,) = rejects_of(run / "rejects.rank0.jsonl")
    assert row["reason"] == "too_long" and row["line"] == 2
    assert row["message"].endswith("tokens; the model has 65,536 positions (max_seq_len)")


# --- 9. inspect on nothing ---------------------------------------------------------------------------

def test_inspect_an_empty_or_binary_file_exits_2(tmp_path, kit):
    """Old code: exit 0 with an empty table (validate, export, view already exit 2)."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blob.jsonl").write_bytes(bytes(range(256)) * 8)
    for name, summary in (("empty.jsonl", "read 0 = accepted 0 + rejected 0"),
                          ("blob.jsonl", "read 9 = accepted 0 + rejected 9")):
        res = runner.invoke(app, ["inspect", str(tmp_path / name), "--tokenizer", str(kit[0])])
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert lines[0].startswith(f"memorywalker inspect: error: {tmp_path / name}: no valid trajectory ({summary}")
