"""Every failure one clear line (issue 15, failures 4-8): exit 2 with one line naming the input and the
cause, inputs checked before the model loads, ``--debug`` for the traceback; ``import`` and
``validate`` fail when nothing was accepted; ``rollout`` refuses to append under another configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.records.io import TrajectoryReader, write_trajectories

runner = CliRunner()


def one_line_error(res, prog: str) -> str:
    """The single output line of a failed command (exit 2, no traceback)."""
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith(f"memorywalker {prog}: error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


def last_line_error(res, prog: str) -> str:
    """import and validate print their summary first; the error is the one last line, exit 2."""
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith(f"memorywalker {prog}: error: ") and "Traceback" not in res.output
    assert sum("error:" in ln for ln in lines) == 1
    return lines[-1]


# --- 4. sft: bad inputs --------------------------------------------------------------------------------

@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "data.jsonl"
    write_trajectories(path, [synthetic_trajectory(SyntheticSpec(turns=2, evictions=0, words=4, seed=i), f"e{i}")
                              for i in range(2)])
    return path


def sft(tmp_path, kit, *args: str, model: str | None = None):
    return runner.invoke(app, ["sft", f"run_dir={tmp_path / 'run'}", f"model={model or kit[1]}",
                               f"tokenizer={kit[0]}", "steps=1", "batch_size=2", "--no-progress", *args])


def test_sft_bad_inputs_fail_in_one_line_before_the_model_loads(tmp_path, kit, data):
    """Old code: 37-53 line tracebacks, the model loaded and config.json written first. The model dir
    here does not exist, so any message about the data proves the data was checked first."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.toml").write_text("steps = \n")
    nomodel = str(tmp_path / "no-model")
    cases = {
        "empty.jsonl: no valid trajectory (read 0 = accepted 0 + rejected 0)":
            sft(tmp_path, kit, f"data={tmp_path / 'empty.jsonl'}", model=nomodel),
        f"{tmp_path}: Is a directory": sft(tmp_path, kit, f"data={tmp_path}", model=nomodel),
        "missing.jsonl: No such file or directory": sft(tmp_path, kit, f"data={tmp_path / 'missing.jsonl'}", model=nomodel),
        "no-model is not a local directory": sft(tmp_path, kit, f"data={data}", model=nomodel),
        "bad.toml: TOML syntax error: Invalid value (at line 1, column 9)":
            sft(tmp_path, kit, "--config", str(tmp_path / "bad.toml"), f"data={data}"),
        "batch_size=2 must be divisible by world_size × grad_accum = 1 × 3": sft(tmp_path, kit, f"data={data}", "grad_accum=3"),
        "No such option: --no-such-flag": sft(tmp_path, kit, f"data={data}", "--no-such-flag"),
    }
    for expected, res in cases.items():
        assert expected in one_line_error(res, "sft")
    assert not (tmp_path / "run" / "config.json").exists()


def test_sft_rerun_without_resume_and_debug(tmp_path, kit, data):
    """Rerunning a run (killed before its first checkpoint: config.json and metrics.jsonl only) without
    --resume: one line with the fix (old code: a 40-line traceback). --debug, anywhere on the command
    line, shows the exception instead."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    line = one_line_error(sft(tmp_path, kit, f"data={data}"), "sft")
    assert line.endswith("already holds a run (config.json, metrics.jsonl): pass --resume to continue or "
                         "choose another run_dir")
    res = sft(tmp_path, kit, f"data={data}", "--debug")
    assert isinstance(res.exception, FileExistsError) and res.exit_code == 1
    res = runner.invoke(app, ["--debug", "sft", f"run_dir={run}", f"data={data}"])
    assert isinstance(res.exception, FileExistsError)
    assert (run / "metrics.jsonl").read_text() == '{"step": 0, "loss": 1.0}\n'


def test_sft_resume_with_a_changed_config_fails_in_one_line(tmp_path, kit, data):
    ok = sft(tmp_path, kit, f"data={data}")
    assert ok.exit_code == 0, ok.output
    line = one_line_error(sft(tmp_path, kit, f"data={data}", "lr=0.5", "steps=2", "--resume"), "sft")
    assert "differs from" in line and "lr: 1e-05 -> 0.5" in line and "--override-config" in line
    res = sft(tmp_path, kit, f"data={data}", "lr=0.5", "steps=2", "--resume", "--override-config")
    assert res.exit_code == 0, res.output


# --- 6. import ----------------------------------------------------------------------------------------

def test_import_fails_when_nothing_is_imported(tmp_path):
    """Old code: exit 0 with 'wrote 0 trajectories' for an empty directory and for a binary file."""
    (tmp_path / "empty").mkdir()
    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(bytes(range(256)) * 8)
    for inp, read in ((tmp_path / "empty", 0), (binary, 9)):  # 8 newlines: 9 lines
        out = tmp_path / f"{inp.stem}-out.jsonl"
        line = one_line_error(runner.invoke(app, ["import", "claude-code", str(inp), "-o", str(out)]), "import")
        assert f"{inp}: no claude-code trajectory imported (read {read} records, rejected {read}" in line
        assert not out.exists()  # no empty output
        assert out.with_name(out.stem + ".rejects.jsonl").exists()


def test_import_reject_counts_add_up_on_a_binary_file(tmp_path):
    """Old code: rejects_by_reason summed to rejected + 1 (the file-level no_calls was mixed in)."""
    from memorywalker.importers import run_import

    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(bytes(range(256)) * 8)
    c = run_import("claude-code", [binary]).counts()
    assert sum(c["rejects_by_reason"].values()) == c["rejected"] == c["read"] == 9
    assert c["dropped_by_reason"] == {"no_calls": 1}


def _cc(uuid, parent, kind, text, mid=None):
    r = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s1", "timestamp": f"2025-01-01T00:00:0{uuid[-1]}Z",
         "message": {"role": kind, "content": text if kind == "user" else [{"type": "text", "text": text}]}}
    if mid:
        r["message"]["id"] = mid
    return r


def test_import_cuts_a_parent_cycle_and_keeps_the_valid_chain(tmp_path):
    """u1→a1→u2→a2 is valid; c1→c3→c2→c1 loops, with responses c2 and c4 hanging off the loop. Old
    code: the whole session dropped as invalid_trajectory:response_in_context. Now the valid calls stay
    selected, the two looping calls are kept unselected with reason parent_cycle, and --strict (which
    fails only on rejected or dropped input) passes."""
    rows = [_cc("u1", None, "user", "hi"), _cc("a1", "u1", "assistant", "yo", "m1"),
            _cc("u2", "a1", "user", "more"), _cc("a2", "u2", "assistant", "ok", "m2"),
            _cc("c1", "c3", "user", "loop"), _cc("c2", "c1", "assistant", "x", "m9"),
            _cc("c3", "c2", "user", "again"), _cc("c4", "c3", "assistant", "y", "m8")]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    res = runner.invoke(app, ["import", "claude-code", str(path), "-o", str(out), "--strict"])
    assert res.exit_code == 0, res.output
    (traj,) = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [(c["selected"], (c.get("reason") or "").split(":")[0]) for c in traj["calls"]] == [
        (True, ""), (True, ""), (False, "parent_cycle"), (False, "parent_cycle")]
    rejects = [json.loads(ln) for ln in (tmp_path / "out.rejects.jsonl").read_text().splitlines()]
    assert [(r["reason"], r["line"], r["kept"]) for r in rejects] == [("parent_cycle", 6, True), ("parent_cycle", 8, True)]


def test_import_strict_fails_on_any_reject(tmp_path):
    rows = [_cc("u1", None, "user", "hi"), _cc("a1", "u1", "assistant", "yo", "m1")]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"type": "weird"}\n')
    out = tmp_path / "out.jsonl"
    assert runner.invoke(app, ["import", "claude-code", str(path), "-o", str(out)]).exit_code == 0
    line = last_line_error(runner.invoke(app, ["import", "claude-code", str(path), "-o", str(out), "--strict"]), "import")
    assert "--strict and 1 records rejected (unknown_record_type=1)" in line
    assert len(out.read_text().splitlines()) == 1  # the accepted trajectory is still written


# --- 7. validate --------------------------------------------------------------------------------------

def test_validate_fails_when_every_line_is_rejected(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n[1]\n")
    line = last_line_error(runner.invoke(app, ["validate", str(bad)]), "validate")
    assert line.endswith("bad.jsonl: no valid trajectory (read 2 = accepted 0 + rejected 2 (bad_json=1, not_an_object=1))")
    good = tmp_path / "good.jsonl"
    write_trajectories(good, [synthetic_trajectory(SyntheticSpec(turns=2, evictions=0, words=4, seed=0), "e0")])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(good.read_text() + "{oops\n")
    assert runner.invoke(app, ["validate", str(mixed)]).exit_code == 0
    line = last_line_error(runner.invoke(app, ["validate", str(mixed), "--strict"]), "validate")
    assert "--strict and 1 of 2 lines rejected" in line


def test_reader_without_rejects_file_holds_constant_memory(tmp_path):
    """Old code kept every rejected line in memory without --rejects (1.04 GB RSS on 1 GB of rejects).
    Now only the first 20 are kept for display; the summary still counts all."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n" * 5000)
    reader = TrajectoryReader(bad)
    assert list(reader) == []
    assert reader.summary.rejected == 5000 and len(reader.rejects) == 20


# --- 8. rollout: resume checks the configuration ------------------------------------------------------

def test_rollout_refuses_to_append_under_another_configuration(tmp_path, kit):
    """Old code appended episodes of another world seed and budget to the same file."""
    out = tmp_path / "r.jsonl"
    args = ["rollout", "--suite", "lookup", "--compressor", "claude-code", "--sampler", "expert", "--n", "1",
            "-o", str(out), "--tokenizer", str(kit[0]), "--no-progress"]
    assert runner.invoke(app, args).exit_code == 0
    before = out.read_bytes()
    line = one_line_error(runner.invoke(app, [*args, "--world-seed", "1", "--budget", "1024"]), "rollout")
    assert "env.world_seed: 0 -> 1" in line and "harness.budget: 2048 -> 1024" in line and "--override-config" in line
    assert out.read_bytes() == before
    args[8] = "2"  # --n 2
    res = runner.invoke(app, [*args, "--world-seed", "1", "--override-config"])
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == 2


# --- demo: --methods is checked before anything is built ----------------------------------------------

def test_demo_methods_are_checked_before_the_run(tmp_path):
    out = tmp_path / "demo"
    line = one_line_error(runner.invoke(app, ["demo", "--methods", "radix,foo", "--out", str(out)]), "demo")
    assert "unknown methods ['foo']" in line and "'radix'" in line
    line = one_line_error(runner.invoke(app, ["demo", "--methods", "radix", "--check-readme", "README.md",
                                              "--out", str(out)]), "demo")
    assert "drop --methods" in line
    line = one_line_error(runner.invoke(app, ["demo", "--methods", "tree-mask,dfs", "--rl-methods", "sdcc,dfs",
                                              "--out", str(out)]), "demo")
    assert "--rl-methods names methods --methods does not train: sdcc" in line
    assert not out.exists()


# --- renamed options: --harness was the compressor's name --------------------------------------------

def test_the_old_option_names_still_work_with_a_line_naming_the_new_ones(tmp_path, kit):
    """``--harness`` named the compression policy before real harnesses ran (``memorywalker harness``), and
    ``--policy`` the sampler: rollout still takes them, says on stderr to write ``--compressor`` /
    ``--sampler``, and writes the same episode; both spellings at once are a usage error (exit 2)."""
    base = ["rollout", "--suite", "lookup", "--sampler", "expert", "--n", "1", "--tokenizer", str(kit[0]), "--no-progress"]
    new = runner.invoke(app, [*base, "--compressor", "opencode", "-o", str(tmp_path / "new.jsonl")])
    old = runner.invoke(app, [*base, "--harness", "opencode", "-o", str(tmp_path / "old.jsonl")])
    assert new.exit_code == old.exit_code == 0, old.output
    assert "--harness is now --compressor" in old.stderr and "--harness" not in new.stderr
    assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "old.jsonl").read_bytes()
    both = runner.invoke(app, [*base, "--harness", "opencode", "--compressor", "none", "-o", str(tmp_path / "x.jsonl")])
    assert both.exit_code == 2 and "give --compressor only" in both.output
    # --policy was the sampler's name: the same
    base[base.index("--sampler")] = "--policy"
    old = runner.invoke(app, [*base, "--compressor", "opencode", "-o", str(tmp_path / "policy.jsonl")])
    assert old.exit_code == 0 and "--policy is now --sampler" in old.stderr, old.output
    assert (tmp_path / "policy.jsonl").read_bytes() == (tmp_path / "new.jsonl").read_bytes()


# --- a bug is not bad input ---------------------------------------------------------------------------

class _Broken:
    """A reader whose internal check fails: what a bug looks like from the command's side."""

    def __init__(self, *args, **kwargs):
        raise ValueError("segment 3 ends before it starts")


def test_a_bug_says_so_in_one_line_exit_1_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    """Old code: every ValueError was bad input (exit 2), an internal check's included, with no hint that
    it may be a bug. Now a plain ValueError from inside the command is one line with its type, "a bug?"
    and how to get the traceback, exit 1; ``--debug`` raises it. The same file with the reader intact
    fails as bad input (an InputError: exit 2, no "a bug")."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    line = last_line_error(runner.invoke(app, ["validate", str(bad)]), "validate")
    assert "no valid trajectory" in line and "a bug" not in line
    monkeypatch.setattr("memorywalker.cli.records_cmd.TrajectoryReader", _Broken)
    res = runner.invoke(app, ["validate", str(bad)])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert lines[0] == ("memorywalker validate: error: ValueError: segment 3 ends before it starts "
                        "(a bug? rerun with --debug for the traceback)")
    res = runner.invoke(app, ["--debug", "validate", str(bad)])
    assert isinstance(res.exception, ValueError) and str(res.exception) == "segment 3 ends before it starts"


def test_what_counts_as_bad_input():
    """Exit 2 for what the user can fix — judged input (InputError and its kinds: ConfigError,
    RecordError, RenderError, ...), a pydantic validation error, a file that does not parse, an OSError;
    exit 1 with "a bug?" for everything else, a plain ValueError included."""
    import pydantic

    from memorywalker.cli.errors import INPUT_ERROR, INTERNAL_ERROR, report
    from memorywalker.errors import InputError
    from memorywalker.recipes.rl_config import RLConfig
    from memorywalker.records.validate import RecordError
    from memorywalker.render.types import RenderError
    from memorywalker.train.config import ConfigError, load_config

    with pytest.raises(pydantic.ValidationError) as invalid:
        pydantic.TypeAdapter(int).validate_python("three")
    with pytest.raises(json.JSONDecodeError) as not_json:
        json.loads("{oops")
    bad_input = [InputError("x"), ConfigError("x"), RecordError("bad_json", "x"), RenderError("x"), invalid.value,
                 not_json.value, FileNotFoundError(2, "No such file or directory", "f.jsonl"),
                 UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")]
    bugs = [ValueError("x"), KeyError("x"), TypeError("x"), IndexError("x"), ZeroDivisionError("x")]
    for e in bad_input:
        assert report("p", e) == INPUT_ERROR, repr(e)
    for e in bugs:
        assert report("p", e) == INTERNAL_ERROR, repr(e)
    with pytest.raises(ConfigError) as info:  # a config value is judged where it is read
        load_config(RLConfig, None, ["steps"])
    assert report("p", info.value) == INPUT_ERROR


def test_a_directory_transformers_refuses_is_bad_input(tmp_path, kit, data):
    """transformers refuses a directory without a tokenizer or a model with a plain ValueError; that is a
    verdict on the user's --tokenizer / model=, so one line naming the directory, exit 2 (not "a bug?")."""
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line_error(runner.invoke(app, ["validate", str(data), "--tokenizer", str(empty)]), "validate")
    assert f"{empty}: not a tokenizer transformers can load (" in line and "a bug" not in line
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    line = one_line_error(sft(tmp_path, kit, f"data={data}", model=str(bare)), "sft")
    assert f"{bare}: not a causal LM transformers can load (Unrecognized model in" in line and "a bug" not in line
