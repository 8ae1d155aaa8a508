"""Nothing lost on resume (issue 15, failures 1, 2 and 8): a checkpoint is trusted only when it verifies
against its manifest; ``--resume`` takes the newest one that verifies, refuses when none does, never
starts over silently, never deletes an intact older checkpoint first, never truncates the metrics
history; and it refuses a changed configuration unless told to override it. Issue 27 (failures 5, 10,
12): it also refuses changed inputs (data, tokenizer), never rewinds a run, removes what killed saves
left behind, and a plain resume adds nothing to config.history.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
from memorywalker.recipes.sft import SFTConfig, train
from memorywalker.records.io import write_trajectories
from memorywalker.train.checkpoint import (
    CheckpointError,
    file_sha256,
    latest_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from memorywalker.train.config import ConfigError


def episodes(n: int) -> list:
    return [synthetic_trajectory(SyntheticSpec(turns=3, evictions=1, words=6, seed=i), f"ep-{i}") for i in range(n)]


def config(kit, run_dir, **kw) -> SFTConfig:
    base = dict(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), batch_size=2, lr=5e-3,
                save_every=2, keep_checkpoints=2)
    return SFTConfig(**{**base, **kw})


def checkpoints(run_dir) -> list[str]:
    return sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("step-*"))


def metric_steps(run_dir) -> list[int]:
    return [json.loads(ln)["step"] for ln in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run6(kit, tmp_path_factory):
    """A 6-step run with checkpoints at steps 4 and 6 (keep 2), and an uninterrupted 8-step reference
    whose weights a correct resume from step 6 must reproduce bitwise."""
    root = tmp_path_factory.mktemp("resume")
    data = episodes(4)
    train(config(kit, root / "run", steps=6), trajectories=data, progress=False)
    train(config(kit, root / "ref", steps=8), trajectories=data, progress=False)
    return root, data


def copy_run(run6, tmp_path) -> Path:
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(run6[0] / "run", dst)
    return dst


# --- 1. a broken `latest` pointer or a missing state.json never restarts the run ----------------------

@pytest.mark.parametrize("damage", ["empty_latest", "latest_names_a_missing_folder", "state_json_missing"])
def test_resume_survives_a_broken_pointer_or_state(run6, tmp_path, kit, damage):
    """Old code: each of these made `--resume` start from step 0, truncate metrics.jsonl and delete the
    intact step-4 checkpoint by the keep-2 rule. Now the newest checkpoint that verifies is used:
    step-6 (pointer damage: the pointer is not needed) or step-4 (step-6 damaged); the result equals
    the uninterrupted run bitwise, and metrics.jsonl holds every step once."""
    run = copy_run(run6, tmp_path)
    ckpts = run / "checkpoints"
    if damage == "empty_latest":
        (ckpts / "latest").write_text("")
    elif damage == "latest_names_a_missing_folder":
        (ckpts / "latest").write_text("step-000099")
    else:
        (ckpts / "step-000006" / "state.json").unlink()
    result = train(config(kit, run, steps=8, resume=True), trajectories=run6[1], progress=False)
    first = 6 if damage != "state_json_missing" else 4
    assert [m["step"] for m in result.metrics] == list(range(first, 8))
    ref, got = load_file(str(run6[0] / "ref" / "final" / "model.safetensors")), load_file(str(run / "final" / "model.safetensors"))
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert metric_steps(run) == list(range(8))
    assert checkpoints(run) == ["step-000006", "step-000008"]


def test_resume_refuses_when_no_checkpoint_verifies(run6, tmp_path, kit):
    """Every checkpoint damaged: a CheckpointError naming each one, exit before training; nothing
    deleted, metrics.jsonl untouched (old code: a silent fresh start that truncated it)."""
    run = copy_run(run6, tmp_path)
    for step in ("step-000004", "step-000006"):
        (run / "checkpoints" / step / "state.json").unlink()
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match=r"no checkpoint verifies \(step-000006: .*step-000004: "):
        train(config(kit, run, steps=8, resume=True), trajectories=run6[1], progress=False)
    assert (run / "metrics.jsonl").read_text() == before
    assert checkpoints(run) == ["step-000004", "step-000006"]


# --- 2. a truncated checkpoint file: fall back to the previous complete checkpoint ---------------------

@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng.pt", "state.json"])
def test_truncated_file_falls_back_to_the_previous_checkpoint(run6, tmp_path, kit, name, capsys):
    """Old code: a 50-line traceback (OSError: [Errno 22], no file named) and no fallback. Now the cut
    file fails verification (size differs from the manifest), the run resumes from step-4, says so,
    and reproduces the uninterrupted run bitwise."""
    run = copy_run(run6, tmp_path)
    f = run / "checkpoints" / "step-000006" / name
    full = f.stat().st_size
    f.write_bytes(f.read_bytes()[: full // 2])
    assert verify_checkpoint(f.parent) == f"{name} has {full // 2} bytes, the manifest says {full}"
    result = train(config(kit, run, steps=8, resume=True), trajectories=run6[1], progress=False)
    assert result.metrics[0]["step"] == 4
    err = capsys.readouterr().err
    assert f"skipped step-000006: {name} has" in err and "step-000004" in err
    ref, got = load_file(str(run6[0] / "ref" / "final" / "model.safetensors")), load_file(str(run / "final" / "model.safetensors"))
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert metric_steps(run) == list(range(8))


def test_same_size_corruption_is_caught_by_the_hash(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = save_checkpoint(tmp_path, 1, model, opt, {})
    f = path / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    assert verify_checkpoint(path) == "model.safetensors does not match its SHA-256 in the manifest"
    assert latest_checkpoint(tmp_path) is None


def test_older_checkpoints_are_kept_until_a_newer_one_verifies(tmp_path):
    """Resumed from step 2 past an unverifiable step-6 folder, saving step 4 deletes nothing newer and
    keeps the newest verified older one (keep=2)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model, opt, {}, keep=2)
    (tmp_path / "checkpoints" / "step-000006").mkdir()  # a folder left without a manifest
    save_checkpoint(tmp_path, 4, model, opt, {}, keep=2)
    assert checkpoints(tmp_path) == ["step-000002", "step-000004", "step-000006"]
    assert latest_checkpoint(tmp_path).name == "step-000004"


# --- 8. resume checks the recorded configuration -----------------------------------------------------

def test_resume_refuses_a_changed_configuration(run6, tmp_path, kit):
    """Old code accepted a changed method, lr, batch size or seed and overwrote config.json. Now each
    is refused with the fields listed; steps may change; --override-config accepts and keeps the
    replaced configuration in config.history.jsonl."""
    run = copy_run(run6, tmp_path)
    recorded = (run / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"lr: 0.005 -> 0.001; method: \"radix\" -> \"tree-mask\"; seed: 0 -> 3"):
        train(config(kit, run, steps=8, resume=True, lr=1e-3, method="tree-mask", seed=3),
              trajectories=run6[1], progress=False)
    with pytest.raises(ConfigError, match=r"batch_size: 2 -> 4"):
        train(config(kit, run, steps=8, resume=True, batch_size=4), trajectories=run6[1], progress=False)
    assert (run / "config.json").read_text() == recorded
    result = train(config(kit, run, steps=7, resume=True, lr=1e-3, override_config=True),
                   trajectories=run6[1], progress=False)
    assert [m["lr"] for m in result.metrics] == [1e-3]
    assert json.loads((run / "config.json").read_text())["lr"] == 1e-3
    assert json.loads((run / "config.history.jsonl").read_text())["lr"] == 5e-3


def test_fresh_start_into_a_used_run_dir_is_refused_before_the_model_loads(tmp_path, kit):
    """A run killed before its first checkpoint (config.json, metrics.jsonl only), rerun without
    --resume: refused with the fix in the message (old code: a 40-line traceback or a silent overwrite)."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="pass --resume to continue or choose another run_dir"):
        train(config(kit, tmp_path, steps=1, model="/nonexistent-model"), trajectories=episodes(2), progress=False)


# --- issue 27: resume compares the inputs, never rewinds, cleans up, records history only on change ----

def test_resume_refuses_data_replaced_in_place(tmp_path, kit):
    """Old code: replacing the data file with other episodes of the same count, then --resume, exited 0
    and trained on the new data. Now the content hash the checkpoint recorded differs: refused, the
    hashes named; --override-config resumes on the new data."""
    data = tmp_path / "data.jsonl"
    write_trajectories(data, episodes(4))
    run = tmp_path / "run"
    train(config(kit, run, steps=2, data=str(data)), progress=False)
    before = file_sha256(data)
    write_trajectories(data, [synthetic_trajectory(SyntheticSpec(turns=3, evictions=1, words=6, seed=i + 50), f"ep-{i}")
                              for i in range(4)])
    with pytest.raises(ConfigError, match=rf"inputs differ .*\(content SHA-256 of data: {before[:12]}\.\.\. -> "
                                          rf"{file_sha256(data)[:12]}\.\.\.\); pass --override-config"):
        train(config(kit, run, steps=4, data=str(data), resume=True), progress=False)
    result = train(config(kit, run, steps=4, data=str(data), resume=True, override_config=True), progress=False)
    assert [m["step"] for m in result.metrics] == [2, 3]


def test_resume_refuses_a_tokenizer_changed_in_place(tmp_path, kit):
    """The tokenizer dir edited in place (same path, so the configuration is unchanged): its chat
    template's hash differs from the checkpoint's."""
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(kit[0], tok)
    run = tmp_path / "run"
    train(config(kit, run, steps=2, tokenizer=str(tok)), trajectories=episodes(2), progress=False)
    template = tok / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>", "<|im_start|> ", 1))
    with pytest.raises(ConfigError, match=r"content SHA-256 of chat_template: "):
        train(config(kit, run, steps=4, tokenizer=str(tok), resume=True), trajectories=episodes(2), progress=False)


def test_resume_with_fewer_steps_than_the_checkpoint_is_refused(run6, tmp_path, kit):
    """Old code: `--resume steps=3` onto the step-6 checkpoint recorded "steps": 3 over step-6 weights.
    Decided: a run is never rewound, so it is refused (steps=6 itself is allowed: nothing left to do)."""
    run = copy_run(run6, tmp_path)
    recorded = (run / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"newest checkpoint of .* is at step 6, past steps=3; a run is never "
                                          r"rewound: pass steps=6 or more"):
        train(config(kit, run, steps=3, resume=True), trajectories=run6[1], progress=False)
    assert (run / "config.json").read_text() == recorded
    assert json.loads((run / "final" / "memorywalker.json").read_text())["steps"] == 6
    result = train(config(kit, run, steps=6, resume=True), trajectories=run6[1], progress=False)
    assert result.metrics == [] and metric_steps(run) == list(range(6))


def test_plain_resume_appends_nothing_to_the_config_history(run6, tmp_path, kit):
    """Old code: every plain --resume appended the config to config.history.jsonl (only `resume`
    differed). Now two plain resumes append nothing; a resume that changes steps appends the replaced
    configuration once."""
    run = copy_run(run6, tmp_path)
    for _ in range(2):
        train(config(kit, run, steps=6, resume=True), trajectories=run6[1], progress=False)
    assert not (run / "config.history.jsonl").exists()
    train(config(kit, run, steps=7, resume=True), trajectories=run6[1], progress=False)
    (old,) = [json.loads(ln) for ln in (run / "config.history.jsonl").read_text().splitlines()]
    assert old["steps"] == 6


def test_killed_saves_are_cleaned_up_after_a_successful_resume(run6, tmp_path, kit, capsys):
    """Old code: `checkpoints/.tmp-step-NNNNNN-PID/` left by saves killed mid-write stayed forever. Now
    the resume that loaded its checkpoint removes them (the run dir's lock says no one else writes)."""
    run = copy_run(run6, tmp_path)
    ckpts = run / "checkpoints"
    (ckpts / ".tmp-step-000008-4242").mkdir()
    (ckpts / ".tmp-step-000008-4242" / "model.safetensors").write_bytes(b"half")
    (ckpts / ".latest-4242").write_text("step-000008")
    (run / ".tmp-final-4242").mkdir()
    train(config(kit, run, steps=8, resume=True), trajectories=run6[1], progress=False)
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-000006", "step-000008"]
    assert not (run / ".tmp-final-4242").exists()
    err = capsys.readouterr().err
    assert "resume: removed what killed saves left behind: .latest-4242, .tmp-final-4242, .tmp-step-000008-4242" in err
