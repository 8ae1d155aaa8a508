"""A run dir belongs to one run: a fresh start needs an unused one, a resume needs the same configuration.

Checked before the model loads, so a wrong command fails in a second with one line:

* a run dir is owned by one process at a time: an advisory lock (``run_dir/.memorywalker.lock``,
  ``flock``) held from the start of a recipe to its end, the file naming the owner's pid, host and
  command. A second process on the same run dir (a second ``sft``, two ``--resume`` at once) is
  refused: "run_dir R is in use by pid P on host H (...)". The kernel drops the lock when its owner
  dies (``kill -9`` included); the next run takes over the stale lock file and says whose it was;
* without ``resume``, a run dir that already holds a run (``config.json``, ``metrics.jsonl``,
  ``checkpoints/``, ``final/``) is refused: "pass --resume to continue or choose another run_dir";
* with ``resume``, every field of the recorded ``config.json`` that changes what a step computes must
  be unchanged; the differing fields are listed, and ``override_config`` (``--override-config``)
  accepts them (the replaced configuration is appended to ``config.history.jsonl``).

After the checkpoint loads, :func:`check_resumed` also compares the content hashes of the inputs
(the data file, the tokenizer and its chat template) with those the checkpoint recorded, and refuses a
``steps`` below the checkpoint's step (a run is never rewound): ``--override-config`` is the only way
past a changed input.

>>> config_changes({"lr": 0.001, "steps": 10, "seed": 0}, {"lr": 0.002, "steps": 20, "seed": 0})
['lr: 0.001 -> 0.002']
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memorywalker.fileio import file_sha256, naming, write_text_atomic
from memorywalker.train.config import ConfigError
from memorywalker.train.distributed import gather_objects, init_distributed
from memorywalker.train.refcache import template_hash, tokenizer_hash

RUN_ARTIFACTS = ("config.json", "metrics.jsonl", "checkpoints", "final")
LOCK_NAME = ".memorywalker.lock"
# Fields that say how and where a run was invoked, not what it is: a resume that changes only these is
# the same configuration (nothing is appended to config.history.jsonl; a moved run dir is the same run).
INVOCATION_FIELDS = frozenset({"resume", "override_config", "run_dir"})
# Fields that do not change what any step computes: a resume may change them freely. ``steps`` only
# moves the end of the run (the learning-rate schedule depends on warmup_steps, not on steps).
RESUMABLE_FIELDS = frozenset({"resume", "override_config", "run_dir", "steps", "save_every",
                              "keep_checkpoints", "tensorboard", "wandb", "wandb_project", "wandb_mode",
                              "device", "parallel",
                              "activation_checkpointing", "checkpoint_chunks", "collective_timeout",
                              "harness_bin", "keep_workdirs"})  # rl tasks=: where the binary is, what is kept


# Fields renamed since a run may have been recorded: old name -> new name (rl's compression policy was
# `harness` until `harness` came to name a real harness, with tasks=; its act calls per episode were
# `max_turns` until they took HarnessConfig's name).
RENAMED_FIELDS = {"harness": "compressor", "max_turns": "max_steps"}


def config_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"field: old -> new"`` for every result-changing field that differs (missing = None). A recorded
    field under its old name (:data:`RENAMED_FIELDS`) counts as the new one.

    >>> config_changes({"harness": "opencode", "lr": 1.0}, {"compressor": "opencode", "harness": None, "lr": 2.0})
    ['lr: 1.0 -> 2.0']
    >>> config_changes({"max_turns": 4, "lr": 1.0}, {"max_steps": 4, "lr": 1.0})
    []
    >>> config_changes({"max_turns": 4}, {"max_steps": 6})
    ['max_steps: 4 -> 6']
    """
    recorded = dict(recorded)
    for old_name, new_name in RENAMED_FIELDS.items():
        if new_name in current and new_name not in recorded and old_name in recorded:
            recorded[new_name] = recorded.pop(old_name)
    out = []
    for key in sorted(set(recorded) | set(current)):
        if key in RESUMABLE_FIELDS:
            continue
        old, new = recorded.get(key), current.get(key)
        if old != new:
            out.append(f"{key}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


class RunDirInUse(OSError):
    """Another live process owns the run dir (one line: who, where, since when)."""


class RunDirLock:
    """The advisory lock of one run dir, held by this process (see the module docstring)."""

    _held: dict[Path, RunDirLock] = {}  # run dirs this process owns now

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, run_dir: str | Path, what: str = "memorywalker") -> RunDirLock:
        """Take the lock of ``run_dir`` (created if needed) or raise :class:`RunDirInUse`."""
        run_dir = Path(run_dir)
        key = run_dir.resolve()
        if key in cls._held:  # flock would refuse too: locks belong to open files, not processes
            raise RunDirInUse(f"run_dir {run_dir} is in use by this process (pid {os.getpid()}, "
                              f"{_describe(_owner(cls._held[key].fd))})")
        _not_a_file(run_dir)
        with naming(run_dir):
            run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        with naming(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            previous = _owner(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise RunDirInUse(f"run_dir {run_dir} is in use by {_describe(previous)}: wait for it to "
                                  "finish or choose another run_dir") from None
            raise OSError(e.errno, f"cannot lock it ({e.strerror})", str(path)) from None
        previous = _owner(fd)
        if previous and previous.get("pid") != os.getpid():
            print(f"{run_dir}: taking over the lock left by {_describe(previous)}, which no process "
                  "holds any more (it ended without releasing it)", file=sys.stderr)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": what,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with naming(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
            os.fsync(fd)
        lock = cls._held[key] = cls(path, fd)
        return lock

    def release(self) -> None:
        """Empty the lock file (a clean end leaves no owner to take over from) and drop the lock."""
        self._held.pop(self.path.parent.resolve(), None)
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _owner(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return {"pid": "?", "host": "?", "command": "an unreadable lock file"}


def _describe(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "another process"
    return (f"pid {owner.get('pid')} on host {owner.get('host')} ({owner.get('command', '?')}, "
            f"since {owner.get('since', '?')})")


@contextmanager
def owned_run_dir(cfg: BaseModel, recipe: str) -> Iterator[RunDirLock | None]:
    """Hold ``cfg.run_dir``'s lock for the block: rank 0 takes it, every rank raises
    :class:`RunDirInUse` when it could not (one all-gather, so no rank waits at a barrier for a rank
    that failed); released when the block ends, normally or not."""
    info = init_distributed(getattr(cfg, "collective_timeout", None))
    lock, refusal = None, None
    if info.is_main:
        try:
            lock = RunDirLock.acquire(cfg.run_dir, f"memorywalker {recipe}")
        except RunDirInUse as e:
            refusal = str(e)
    refusal = gather_objects(refusal)[0]
    if refusal is not None:
        raise RunDirInUse(refusal)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def _not_a_file(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"run_dir {run_dir}: is a file, not a directory")


def check_run_dir(cfg: BaseModel) -> None:
    """Refuse a used run dir without ``resume``, and a resume whose configuration changed."""
    run_dir = Path(cfg.run_dir)
    _not_a_file(run_dir)
    used = [name for name in RUN_ARTIFACTS if (run_dir / name).exists()]
    if not cfg.resume:
        if used:
            raise FileExistsError(f"run_dir {run_dir} already holds a run ({', '.join(used)}): "
                                  "pass --resume to continue or choose another run_dir")
        return
    path = run_dir / "config.json"
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: the recorded configuration is unreadable ({e})") from None
    changed = config_changes(recorded, cfg.model_dump(mode="json"))
    if changed and not getattr(cfg, "override_config", False):
        raise ConfigError(f"resume: the configuration differs from {path} in {'; '.join(changed)}; "
                          "pass --override-config to resume with the new values")


def input_hashes(tokenizer, trajectories=None, **files: str | Path | None) -> dict[str, str]:
    """Content hashes of what a run reads: each named input file (SHA-256 of its bytes), the data given
    in memory when there is no data file (SHA-256 of its records), the tokenizer and its chat
    template. Kept in every checkpoint, compared on resume (:func:`check_resumed`)."""
    out = {"tokenizer": tokenizer_hash(tokenizer), "chat_template": template_hash(tokenizer)}
    out.update({name: file_sha256(p) for name, p in files.items() if p})
    if "data" not in out and trajectories is not None:
        h = hashlib.sha256()
        for t in trajectories:
            h.update(json.dumps(t.to_json_dict(), sort_keys=True).encode() + b"\n")
        out["data"] = h.hexdigest()
    return out


def check_resumed(cfg: BaseModel, state: dict[str, Any] | None, inputs: dict[str, str]) -> None:
    """After a checkpoint loaded (``state``): refuse ``steps`` below its step, and inputs whose content
    hashes differ from the ones it recorded (unless ``override_config``). A checkpoint written before
    hashes were recorded is not compared."""
    if state is None:
        return
    step = state.get("step", 0)
    if cfg.steps < step:
        raise ConfigError(f"resume: the newest checkpoint of {cfg.run_dir} is at step {step}, past steps="
                          f"{cfg.steps}; a run is never rewound: pass steps={step} or more (or move the newer "
                          "checkpoints away)")
    recorded = state.get("inputs") or {}
    changed = [f"{k}: {recorded[k][:12]}... -> {v[:12]}..." for k, v in inputs.items()
               if k in recorded and recorded[k] != v]
    if changed and not getattr(cfg, "override_config", False):
        raise ConfigError(f"resume: the inputs differ from what the checkpoint was trained on "
                          f"(content SHA-256 of {'; '.join(changed)}); pass --override-config to resume on them")


def record_config(cfg: BaseModel) -> None:
    """Write ``run_dir/config.json`` (atomically); a replaced one that differs in more than how and where
    the run was invoked (``resume``, ``override_config``, ``run_dir``) goes to ``config.history.jsonl``."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    text = cfg.model_dump_json(indent=2)
    if path.exists():
        old = path.read_text()
        if old == text:
            return
        try:
            recorded = json.loads(old)
        except ValueError:
            recorded = {"unparsable": old}
        current = json.loads(text)
        if {k: v for k, v in recorded.items() if k not in INVOCATION_FIELDS} != \
                {k: v for k, v in current.items() if k not in INVOCATION_FIELDS}:
            with naming(run_dir / "config.history.jsonl"), \
                    open(run_dir / "config.history.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(recorded) + "\n")
    write_text_atomic(path, text)
