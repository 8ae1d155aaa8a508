"""Harness rollouts: G sessions of a real harness per task, N processes at once, through one gateway.

Each session runs in a fresh workdir holding the task's files (under bubblewrap where asked), against the
gateway's ``/r/TAG`` routes so its calls are tagged with the session (:mod:`.app`); when the process
ends, the gateway finalizes the tag's sessions into trajectories and the task's verifier scores the
workdir (:mod:`.tasks`). A session **fails** — kept with its reason, never dropped or scored 0 in
disguise — when the harness is killed at its deadline, exits non-zero, makes no call, or the verifier
fails; or ``backend_down`` when a call of it found the gateway's backend gone (a ``vllm serve`` that
died: the harness is stopped at once rather than left retrying until its deadline, and whatever it did
afterwards is not scored). ``memorywalker rl tasks=FILE harness=...`` runs a step's sessions through
:func:`run_sessions`.
"""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memorywalker.gateway.harnesses import find_binary, run_harness
from memorywalker.gateway.tasks import HarnessTask, verify
from memorywalker.records.schema import Trajectory

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colours some harnesses print despite NO_COLOR


@dataclass(frozen=True)
class SessionJob:
    task: HarnessTask
    sample: int  # index in the task's group
    tag: str  # the gateway route tag; also the session's name in the step's records


@dataclass
class SessionResult:
    job: SessionJob
    trajectories: list[Trajectory] = field(default_factory=list)  # main line first, then side lines
    reward: float | None = None
    failed: str | None = None  # why the session cannot be scored; None when it finished
    returncode: int | None = None  # None: killed at the deadline
    seconds: float = 0.0
    harness_output: str = ""  # the tail of the harness's stderr (stdout when it wrote none)
    verifier_output: str = ""

    @property
    def main(self) -> Trajectory | None:
        return next((t for t in self.trajectories if t.lineage is None or t.lineage.relation != "side"), None)

    @property
    def calls(self) -> int:
        return sum(len(t.calls) for t in self.trajectories)

    @property
    def compactions(self) -> int:
        """Summarize branches of the main line: compactions the harness made and continued from."""
        main = self.main
        return int(main.meta.get("branches", {}).get("summarize", 0)) if main is not None else 0

    def row(self) -> dict[str, Any]:
        """The session as one JSON row (``rollouts/step-N.sessions.jsonl``)."""
        main = self.main
        return {"tag": self.job.tag, "task": self.job.task.id, "sample": self.job.sample, "reward": self.reward,
                "failed": self.failed, "returncode": self.returncode, "seconds": round(self.seconds, 2),
                "calls": self.calls, "compactions": self.compactions,
                "branches": main.meta.get("branches", {}) if main is not None else {},
                "trajectories": [t.id for t in self.trajectories],
                "harness_output": self.harness_output, "verifier_output": self.verifier_output}


def run_sessions(gateway, url: str, jobs: list[SessionJob], harness: str, *, model: str, concurrency: int = 1,
                 deadline_s: float = 600, compact_tokens: int | None = None, bin_dir: str | None = None,
                 sandbox: bool = False, workroot: Path, keep_workdirs: bool = False,
                 verifier_timeout_s: float = 60.0) -> list[SessionResult]:
    """Run every job's session (``concurrency`` at once) against ``gateway`` served at ``url``; results in
    the order of ``jobs``. Workdirs are made under ``workroot`` and removed unless ``keep_workdirs``."""
    find_binary(harness, bin_dir)  # a missing harness fails once, here, not once per session

    def one(job: SessionJob) -> SessionResult:
        result = SessionResult(job)
        workdir = workroot / job.tag
        try:
            run = run_harness(harness, job.task.prompt, url=f"{url}/r/{job.tag}", model=model, files=job.task.files,
                              deadline_s=job.task.deadline_s or deadline_s, compact_tokens=compact_tokens,
                              bin_dir=bin_dir, workdir=workdir, sandbox=sandbox, window=gateway.max_positions,
                              stop=lambda: _down(gateway, job.tag) is not None)
        finally:  # whatever happened to the process, its calls become trajectories
            result.trajectories = sorted(gateway.finalize_tag(job.tag),
                                         key=lambda t: t.lineage is not None and t.lineage.relation == "side")
        result.returncode, result.seconds = run.returncode, run.seconds
        result.harness_output = _ANSI.sub("", run.stderr.strip() or run.stdout.strip())[-2000:]
        down = _down(gateway, job.tag)
        if down is not None:  # "backend_down: URL: cause"
            result.failed = down
        elif run.returncode is None:
            result.failed = f"deadline: the harness was killed after {run.seconds:.0f} s"
        elif run.returncode != 0:
            last = (result.harness_output.splitlines() or [""])[-1].strip()
            result.failed = f"the harness exited {run.returncode}" + (f": {last[:200]}" if last else "")
        elif result.main is None:
            result.failed = "the harness made no model call"
        else:
            started = time.monotonic()
            verdict = verify(job.task.verifier, run.workspace.workdir, timeout_s=verifier_timeout_s,
                             wrap=run.workspace.wrap, env=run.workspace.env({}))
            result.seconds += time.monotonic() - started
            result.verifier_output = verdict.output
            result.reward, result.failed = verdict.reward, verdict.error
        if not keep_workdirs:
            shutil.rmtree(run.workspace.workdir, ignore_errors=True)
            shutil.rmtree(run.workspace.home, ignore_errors=True)
        return result

    workroot.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, jobs))


def _down(gateway, tag: str) -> str | None:
    """Why the server of the session tagged ``tag`` went down, when a call of it found it gone (None: it did not)."""
    return gateway.backend_failures.get(tag)
