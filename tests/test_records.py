"""Schema v1, validation reason codes and streaming I/O."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from memorywalker.records import (
    REASONS,
    SCHEMA_VERSION,
    RecordError,
    RecordLimits,
    TrajectoryBuilder,
    TrajectoryReader,
    TrajectoryWriter,
    json_schema,
    read_trajectories,
)

DATA = Path(__file__).parent / "data"
BAD = sorted((DATA / "bad_records").glob("*.jsonl"))
VALID = (DATA / "valid_record.json").read_text()


# The corpus is read with a 16 KiB record limit: record_too_large.jsonl is 20 KB, every other file ~1 KB.
LIMITS = RecordLimits(max_bytes=16384)


def test_corpus_covers_every_reason_but_cross_record_ones():
    """One file per reason code; duplicate_trajectory_id needs two records and is tested below;
    too_long needs a renderer and a model's positions (tests/test_limits.py)."""
    assert {p.stem for p in BAD} == set(REASONS) - {"duplicate_trajectory_id", "too_long"}
    assert len(REASONS) >= 20


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_each_bad_kind_is_rejected_with_its_reason(path, tmp_path):
    rejects = tmp_path / "rejects.jsonl"
    reader = TrajectoryReader(path, rejects_path=rejects, vocab_size=1000, limits=LIMITS)
    assert list(reader) == []
    assert reader.summary.as_dict() == {"read": 1, "accepted": 0, "rejected": 1, "by_reason": {path.stem: 1}}
    (row,) = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert row["reason"] == path.stem and row["line"] == 1 and row["message"]
    raw = path.read_bytes().decode("utf-8", "replace").rstrip("\n")
    if path.stem == "record_too_large":  # not held: its first 4 KiB, and its size
        raw = raw[:4096] + f"... [cut: the line has {len(raw):,} bytes]"
    assert row["raw"] == raw


def test_valid_lines_around_bad_ones_are_all_kept(tmp_path):
    """valid, 31 bad kinds interleaved with valid lines (distinct ids), then a truncated tail.

    Lines: 1 + 2·(N−1) + 1 where N−1 = 31 non-truncation kinds each followed by a valid copy; the
    truncated record must be last. read = accepted + rejected = 32 + 32.
    """
    mixed = tmp_path / "mixed.jsonl"
    lines, n_valid = [], 0

    def valid():
        nonlocal n_valid
        rec = json.loads(VALID)
        rec["id"] = f"ok-{n_valid}"
        n_valid += 1
        return (json.dumps(rec) + "\n").encode()

    lines.append(valid())
    for p in BAD:
        if p.stem != "truncated_line":
            lines += [p.read_bytes(), valid()]
    lines.append((DATA / "bad_records" / "truncated_line.jsonl").read_bytes())
    mixed.write_bytes(b"".join(lines))
    reader = TrajectoryReader(mixed, vocab_size=1000, limits=LIMITS)
    ids = [t.id for t in reader]
    assert ids == [f"ok-{i}" for i in range(n_valid)] and n_valid == 32
    s = reader.summary
    assert (s.read, s.accepted, s.rejected) == (64, 32, 32)
    assert s.by_reason == {p.stem: 1 for p in BAD}


def test_duplicate_trajectory_id_is_rejected_and_first_kept(tmp_path):
    f = tmp_path / "dup.jsonl"
    f.write_text(VALID + VALID)
    reader = TrajectoryReader(f)
    assert [t.id for t in reader] == ["bad-0"]
    assert reader.summary.by_reason == {"duplicate_trajectory_id": 1}
    assert reader.rejects[0].line == 2


def test_final_line_without_newline_that_parses_is_accepted(tmp_path):
    f = tmp_path / "nonl.jsonl"
    f.write_text(VALID.rstrip("\n"))
    assert [t.id for t in TrajectoryReader(f)] == ["bad-0"]


def test_round_trip_and_json_schema_accepts_written_records(tmp_path):
    b = TrajectoryBuilder("rt")
    s, u = b.message("system", "sys"), b.message("user", "ünïcode ✓")
    a = b.message("assistant", "", reasoning="hmm", tool_calls=[{"id": "c", "name": "f", "arguments": "{bad json"}])
    b.call([s, u], a, response_tokens=[1, 2], context_tokens=[3], rollout_logprobs=[-0.1, -2.0],
           finish_reason="tool_calls")
    traj = b.build()
    path = tmp_path / "rt.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(traj)
    (back,) = read_trajectories(path)
    assert back == traj
    schema = json_schema()
    assert schema["$id"] == SCHEMA_VERSION
    jsonschema.validate(json.loads(path.read_text()), schema)
    jsonschema.validate(json.loads(VALID), schema)


def test_writer_appends_for_resumable_runs(tmp_path):
    path = tmp_path / "a.jsonl"
    for i in range(3):
        with TrajectoryWriter(path, mode="a") as w:
            rec = json.loads(VALID)
            rec["id"] = f"r{i}"
            w.write(rec)
    assert [t.id for t in TrajectoryReader(path)] == ["r0", "r1", "r2"]


def test_read_trajectories_raises_with_reason(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_bytes((DATA / "bad_records" / "empty_context.jsonl").read_bytes())
    with pytest.raises(RecordError) as e:
        read_trajectories(f)
    assert e.value.code == "empty_context"


def test_reader_streams_without_holding_records(tmp_path):
    """The reader is lazy: the first record is yielded before a bad line further down is read."""
    f = tmp_path / "lazy.jsonl"
    f.write_text(VALID + "not json\n")
    reader = TrajectoryReader(f)
    it = iter(reader)
    next(it)
    assert reader.summary.read == 1
    assert list(it) == [] and reader.summary.read == 2


def test_every_reason_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "records.md").read_text()
    assert all(f"`{code}`" in doc for code in REASONS)


def test_one_meaning_per_reason_code():
    """One table of meanings: the importers' table takes the codes it shares with the records' from
    REASONS (it once typed its own words for eight of them: "a line (or the file) is not valid JSON"
    beside "the line is not valid JSON"), and docs/records.md's table says what REASONS says."""
    from memorywalker.importers import IMPORT_REASONS
    from memorywalker.records.validate import SHARED_REASONS

    assert set(IMPORT_REASONS) & set(REASONS) == set(SHARED_REASONS)
    assert all(IMPORT_REASONS[code] is REASONS[code] for code in SHARED_REASONS)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "records.md").read_text()
    assert [code for code, text in REASONS.items() if f"| `{code}` | {text} |" not in doc] == []
