"""Harness tasks: what one RL rollout of a real harness is asked to do, and the verifier that scores it.

A task file holds one JSON object per line::

    {"id": "sum-7", "prompt": "Read notes.txt and write the number in it to answer.txt.",
     "files": {"notes.txt": "The number is 7.\\n", "data/big.csv": {"path": "fixtures/big.csv"}},
     "verifier": "[ -f answer.txt ] && grep -qx 7 answer.txt", "deadline": 300}

* ``prompt`` (required): the harness's non-interactive prompt.
* ``files``: placed in the session's fresh workdir before it starts: name → text, or ``{"path": P}`` to
  copy a file (P relative to the task file). Names stay inside the workdir.
* ``verifier`` (required): a shell command run in the workdir after the session (``bash -c``). Its
  reward follows the convention of ``grep``/``diff``/``cmp``: exit 0 is a pass (reward 1, or the score it
  prints as its last line of output, a number in [0, 1]); exit 1 is a fail (reward 0); anything else —
  another exit status, a signal, its timeout, a printed score outside [0, 1] — is the verifier failing,
  and the session is recorded as failed with that reason, never as a reward of 0 in disguise. Mind
  tools whose exit 2 means a missing file (``grep``, ``cmp``): an answer the agent never wrote is a
  fail, so test for it first (``[ -f answer.txt ] && grep -qx 7 answer.txt``).
* ``deadline``: seconds before the harness is killed (the run's ``deadline`` when absent).
* ``id``: unique; ``task-<line>`` when absent.

:func:`read_tasks` keeps the good lines and sets each bad one aside with its line number and reason.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from memorywalker.errors import InputError

KEYS = {"id", "prompt", "files", "verifier", "deadline", "meta"}


@dataclass(frozen=True)
class HarnessTask:
    id: str
    prompt: str
    verifier: str
    files: dict[str, str] = field(default_factory=dict)  # name in the workdir -> text
    deadline_s: float | None = None  # None: the run's
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejected:
    line: int
    reason: str


class TaskError(InputError):
    """One task line that cannot be used, and why."""


def _files(value: Any, root: Path) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TaskError("'files' must map names to text or {\"path\": ...}")
    out = {}
    for name, spec in value.items():
        p = PurePosixPath(name)
        if not name or p.is_absolute() or ".." in p.parts:
            raise TaskError(f"file name {name!r} must be a relative path inside the workdir")
        if isinstance(spec, str):
            out[name] = spec
        elif isinstance(spec, dict) and set(spec) == {"path"} and isinstance(spec["path"], str):
            src = root / spec["path"]
            try:
                out[name] = src.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise TaskError(f"file {name!r}: cannot read {src}: {e.__class__.__name__}: {e}") from None
        else:
            raise TaskError(f"file {name!r}: give its text, or {{\"path\": ...}}")
    return out


def parse_task(data: Any, line: int, root: Path) -> HarnessTask:
    """One task line's JSON → a :class:`HarnessTask`, or :class:`TaskError` naming what is wrong."""
    if not isinstance(data, dict):
        raise TaskError(f"a task is a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise TaskError(f"unknown field(s) {unknown}; a task has {sorted(KEYS)}")
    prompt, verifier = data.get("prompt"), data.get("verifier")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskError("'prompt' must be a non-empty string")
    if not isinstance(verifier, str) or not verifier.strip():
        raise TaskError("'verifier' must be a shell command (a non-empty string)")
    deadline = data.get("deadline")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not math.isfinite(deadline) or deadline <= 0):
        raise TaskError(f"'deadline' must be a positive number of seconds, not {deadline!r}")
    tid = data.get("id", f"task-{line}")
    if not isinstance(tid, str) or not tid or any(c in tid for c in "/\\\n"):
        raise TaskError(f"'id' must be a non-empty string without slashes or newlines, not {tid!r}")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise TaskError("'meta' must be an object")
    return HarnessTask(tid, prompt, verifier, _files(data.get("files", {}), root),
                       float(deadline) if deadline is not None else None, meta)


def read_tasks(path: str | os.PathLike) -> tuple[list[HarnessTask], list[Rejected]]:
    """The tasks of a task file and the lines set aside (line number, reason). Blank lines are skipped.

    Raises ``FileNotFoundError`` for a missing file and ``InputError`` when no line is a usable task."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    tasks: list[HarnessTask] = []
    rejected: list[Rejected] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            rejected.append(Rejected(n, f"not JSON: {e.msg} at column {e.colno}"))
            continue
        try:
            task = parse_task(data, n, path.parent)
        except TaskError as e:
            rejected.append(Rejected(n, str(e)))
            continue
        if task.id in seen:
            rejected.append(Rejected(n, f"duplicate id {task.id!r}"))
            continue
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        why = "; ".join(f"line {r.line}: {r.reason}" for r in rejected[:3]) or "it is empty"
        raise InputError(f"{path}: no usable task ({why})")
    return tasks, rejected


@dataclass(frozen=True)
class Verdict:
    reward: float | None  # None: the verifier failed (``error`` says how)
    error: str | None = None
    output: str = ""  # the tail of what it printed


def verify(command: str, workdir: Path, *, timeout_s: float = 60.0, wrap=None, env: dict[str, str] | None = None) -> Verdict:
    """Run the verifier ``command`` in ``workdir`` (see the module docstring for its convention).

    ``wrap(argv) -> (argv, cwd)``: run it inside the session's sandbox. ``env``: the environment.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> verify("true", d), verify("false", d).reward, verify("echo 0.25", d).reward
    (Verdict(reward=1.0, error=None, output=''), 0.0, 0.25)
    >>> verify("exit 3", d).error, verify("echo 7", d).error
    ('the verifier exited 3', 'the verifier printed 7: a score is a number in [0, 1]')
    """
    argv, cwd = ["bash", "-c", command], workdir
    if wrap is not None:
        argv, cwd = wrap(argv)
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout_s, errors="replace")
    except subprocess.TimeoutExpired:
        return Verdict(None, f"the verifier ran past its timeout of {timeout_s:g} s")
    except OSError as e:
        return Verdict(None, f"the verifier could not start: {e}")
    tail = (p.stdout.strip().splitlines() or [""])[-1].strip()
    output = (p.stdout + p.stderr)[-2000:]
    if p.returncode == 1:
        return Verdict(0.0, None, output)
    if p.returncode != 0:
        how = f"was killed by signal {-p.returncode}" if p.returncode < 0 else f"exited {p.returncode}"
        last = (p.stderr.strip().splitlines() or [""])[-1].strip()
        return Verdict(None, f"the verifier {how}" + (f": {last[:200]}" if last else ""), output)
    if not tail:
        return Verdict(1.0, None, output)
    try:
        score = float(tail)
    except ValueError:
        return Verdict(1.0, None, output)  # exit 0 and prose: a pass
    if not 0.0 <= score <= 1.0:
        return Verdict(None, f"the verifier printed {tail[:40]}: a score is a number in [0, 1]", output)
    return Verdict(score, None, output)
