"""The RL recipe's rollouts when every episode is a session of a real harness (``tasks=FILE harness=...``).

One step: the next ``prompts_per_step`` tasks of the task file (cycling), ``group_size`` sessions each,
``concurrency`` harness processes at once per rank, through a gateway per rank (on its loopback)
serving the weights being trained (:mod:`memorywalker.gateway`). Each rank runs the sessions of its
contiguous share of the tasks, so a task's group is collected, rewarded and trained on one rank. The
gateway's sampler is the recipe's (``rollout_engine=hf``: the model object being trained, one call at a
time; ``vllm``: the in-process engine the recipe syncs after every update; ``vllm-server``: the fleet
every rank shares, every call in flight at once), so the step's rollout logprobs are those of the
weights the step starts from. Each session's main line (its
act calls and the compactions the harness made, branches included) is one episode of its task's GRPO
group, rewarded by the task's verifier; side lines (a title, a subagent) are kept in the records but
not trained. Failed sessions are kept with their reason: ``failed_sessions=exclude`` leaves them out
of the group's advantage, ``zero`` counts a failed session that made calls as reward 0.

Records: ``rollouts/step-N/`` (the gateway's journals and ``trajectories.jsonl``; ``step-N/rank-R/``
under several ranks), ``rollouts/step-N.jsonl`` (every trajectory of the step, ``meta["rl"]`` saying its
task, sample, reward, failure and rank) and ``rollouts/step-N.sessions.jsonl`` (one row per session,
failed ones too): one of each per step for the whole run, written by rank 0 from every rank's sessions.
A step's records left by a killed run are moved to ``rollouts/abandoned/`` before the step is
collected again, so no step's rollouts are trained twice.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

from memorywalker.gateway.backends import FleetBackend, SamplerBackend, Scripted, ScriptedBackend
from memorywalker.gateway.core import Gateway
from memorywalker.gateway.harnesses import find_binary, sandbox_available
from memorywalker.gateway.rollouts import SessionJob, SessionResult, run_sessions
from memorywalker.gateway.server import BackgroundServer
from memorywalker.gateway.tasks import HarnessTask, read_tasks
from memorywalker.records.io import TrajectoryWriter
from memorywalker.records.schema import Trajectory
from memorywalker.render import Renderer
from memorywalker.train.distributed import DistInfo, barrier, gather_to_main
from memorywalker.train.step import rank_micro_batches


class HarnessRollouts:
    """Collects one step's harness sessions (see the module docstring)."""

    def __init__(self, cfg, policy, renderer: Renderer, run_dir: Path, *, positions: int, info: DistInfo = DistInfo(),
                 log=print, chat_template: str | None = None):
        self.cfg, self.policy, self.renderer, self.info = cfg, policy, renderer, info
        self.chat_template = chat_template  # the label of the template rendering (the records carry it)
        self.root = run_dir / "rollouts"
        self.positions = positions
        find_binary(cfg.harness, cfg.harness_bin)  # a missing harness fails before any step, in one line
        self.tasks, rejected = read_tasks(cfg.tasks)
        for r in rejected:
            log(f"{cfg.tasks}:{r.line}: set aside: {r.reason}")
        self.rejected = len(rejected)
        if cfg.sandbox == "none":
            self.sandbox = False
        elif sandbox_available():
            self.sandbox = True
        elif cfg.sandbox == "bwrap":
            raise FileNotFoundError("sandbox=bwrap: bwrap (bubblewrap) is not installed (`apt-get install bubblewrap`)")
        else:
            self.sandbox = False
            log("rl: bwrap (bubblewrap) is not installed: harness sessions run unsandboxed, each in a fresh "
                "workdir with a private HOME (sandbox=none says so explicitly)")

    def next_tasks(self, cursor: int) -> tuple[list[HarnessTask], int]:
        """The step's tasks from ``cursor`` on, cycling through the file; the new cursor."""
        n = len(self.tasks)
        return [self.tasks[(cursor + i) % n] for i in range(self.cfg.prompts_per_step)], cursor + self.cfg.prompts_per_step

    def _backend(self):
        if self.cfg.script:  # a pipeline check: the script's responses, scored by the weights being trained
            return ScriptedBackend(Scripted.load(self.cfg.script), self.renderer, self.policy)
        if self.cfg.rollout_engine == "vllm-server":  # the fleet: a session on one server, no lock
            return FleetBackend(self.policy)
        return SamplerBackend(self.cfg.rollout_engine, self.policy, concurrent=False)

    def collect(self, step: int, tasks: list[HarnessTask]) -> tuple[list[list[Trajectory]], list[SessionResult], dict]:
        """The step's sessions of this rank's share of ``tasks`` (every rank's tasks of the step, in order):
        (one GRPO group of main lines per task of this rank, the results — on rank 0 every rank's —, metrics).
        Every rank calls it (it gathers); :meth:`prepare`, :meth:`run` and :meth:`finish` in a row."""
        self.prepare(step)
        return self.finish(step, self.run(step, tasks))

    def prepare(self, step: int) -> None:
        """Before a step's sessions, on every rank: an interrupted run's records of it moved aside (rank 0)."""
        if self.info.is_main:
            self._set_aside(step)
        barrier()  # nothing of this step is written before an interrupted run's records are out of the way

    def run(self, step: int, tasks: list[HarnessTask]) -> tuple:
        """This rank's sessions of the step, nothing shared with the other ranks (so it may run in a thread
        beside training: ``off_policy_steps=1``); what :meth:`finish` takes."""
        cfg, info = self.cfg, self.info
        out = self.root / f"step-{step}"
        if info.world_size > 1:
            out = out / f"rank-{info.rank}"
        (mine,) = rank_micro_batches(list(enumerate(tasks)), info, 1)  # (index in the step, task): contiguous
        if hasattr(self.policy, "start"):
            self.policy.start(None)  # no K/V cached under the weights before the last update
        # rank 0's seeds are a one-rank run's; each rank's calls draw from seeds of their own
        gateway = Gateway(self.renderer, self._backend(), out, model_name=cfg.served_name, max_positions=self.positions,
                          max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 100_003 + step + info.rank * 50_000_017,
                          harness=cfg.harness, temperature=cfg.temperature, tool_parser=cfg.tool_parser,
                          chat_template=self.chat_template)
        jobs = [SessionJob(task, j, f"s{step}-t{i}-{j}") for i, task in mine for j in range(cfg.group_size)]
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mw-rl-") as tmp, BackgroundServer(gateway) as url:
            workroot = out / "work" if cfg.keep_workdirs else Path(tmp)
            results = run_sessions(gateway, url, jobs, cfg.harness, model=cfg.served_name, concurrency=cfg.concurrency,
                                   deadline_s=cfg.deadline, compact_tokens=cfg.compact_at, bin_dir=cfg.harness_bin,
                                   sandbox=self.sandbox, workroot=workroot, keep_workdirs=cfg.keep_workdirs,
                                   verifier_timeout_s=cfg.verifier_timeout)
        return len(mine), results, time.perf_counter() - started

    def finish(self, step: int, ran: tuple) -> tuple[list[list[Trajectory]], list[SessionResult], dict]:
        """Every rank: its groups; rank 0: every rank's sessions gathered, the step's records written."""
        n_tasks, results, seconds = ran
        trained = []  # per session, its main line when it joins its group's advantage
        for r in results:
            main = r.main
            if main is not None and (r.failed is None or self.cfg.failed_sessions == "zero"):
                main.reward = r.reward if r.failed is None else 0.0
                trained.append(main)
            else:
                trained.append(None)
        g = self.cfg.group_size
        groups = [[t for t in trained[i * g:(i + 1) * g] if t is not None] for i in range(n_tasks)]
        everyone = gather_to_main((results, [t is not None for t in trained], seconds))  # rank 0 only
        if everyone is None:
            return groups, results, self._metrics(results, seconds)
        results = [r for rank_results, _, _ in everyone for r in rank_results]
        flags = [f for _, rank_flags, _ in everyone for f in rank_flags]
        self._write(step, results, flags, ranks=[k for k, (rr, _, _) in enumerate(everyone) for _ in rr])
        return groups, results, self._metrics(results, max(s for _, _, s in everyone))

    def _set_aside(self, step: int) -> None:
        """Records of this step left by a run that was killed before its checkpoint: never trained again."""
        stale = [p for p in (self.root / f"step-{step}", self.root / f"step-{step}.jsonl",
                             self.root / f"step-{step}.sessions.jsonl") if p.exists()]
        if stale:
            dest = self.root / "abandoned" / f"step-{step}-{time.strftime('%Y%m%dT%H%M%S')}"
            dest.mkdir(parents=True, exist_ok=True)
            for p in stale:
                shutil.move(str(p), dest / p.name)
            warnings.warn(f"rl: step {step}'s rollouts from an interrupted run moved to {dest}; collecting anew",
                          stacklevel=2)

    def _write(self, step: int, results: list[SessionResult], trained: list[bool], ranks: list[int]) -> None:
        """The step's records, every rank's sessions in task order; ``trained``: whether a session's main
        line joined its group's advantage; ``ranks``: the rank that ran it."""
        with TrajectoryWriter(self.root / f"step-{step}.jsonl") as w:
            for r, was_trained, rank in zip(results, trained, ranks, strict=True):
                main = r.main
                for t in r.trajectories:
                    t.meta["rl"] = {"step": step, "task": r.job.task.id, "sample": r.job.sample, "session": r.job.tag,
                                    "reward": r.reward, "failed": r.failed, "trained": was_trained and t is main,
                                    "rank": rank}
                    w.write(t)
        with open(self.root / f"step-{step}.sessions.jsonl", "w", encoding="utf-8") as f:
            for r, rank in zip(results, ranks, strict=True):
                f.write(json.dumps({**r.row(), "rank": rank}) + "\n")

    def _metrics(self, results: list[SessionResult], seconds: float) -> dict:
        done = [r for r in results if r.failed is None]
        why = Counter(r.failed.split(":")[0] for r in results if r.failed is not None)
        return {"sessions": len(results), "sessions_failed": len(results) - len(done),
                "failed_reasons": dict(why), "compactions_per_session": statistics.fmean(r.compactions for r in results),
                "calls_per_session": statistics.fmean(r.calls for r in results),
                "harness_seconds": seconds}
