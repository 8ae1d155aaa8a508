"""Several episodes in lockstep, their model calls batched: one batched forward per token for all.

A harness episode is sequential (each call's context depends on the last response), but the episodes
of a GRPO group, or of an evaluation, are independent. :func:`run_episodes` runs each in its own thread
on a shallow copy of the environment; a thread runs only while it holds the round's lock, so the
episodes' harness and environment code never runs concurrently (tokenizers and environments need no
thread safety). When every unfinished episode waits on a model call, the calls go to the policy's
``generate_batch`` together, in episode order (:meth:`~memorywalker.samplers.hf.HFPolicy.generate_batch`:
one batched forward per token; :meth:`~memorywalker.samplers.vllm.VLLMPolicy.generate_batch`: one
vLLM ``generate`` of all the requests), and each thread continues with its own response. Which episodes share a round depends only on the episodes,
not on thread timing, so a run is deterministic.

``memorywalker bench rollouts`` times it against one-by-one episodes (``docs/rollouts.md``, "Lockstep
episodes": 4x on the demo's model on a 2-core CPU).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

from memorywalker.records.schema import Task, Trajectory
from memorywalker.rollout.environments.base import Environment
from memorywalker.rollout.episodes.harness import HarnessConfig, run_episode
from memorywalker.samplers.base import PolicyOutput, PolicyRequest


@dataclass
class EpisodeJob:
    """One planned episode (:func:`~memorywalker.rollout.episodes.runner.plan`), run alone or in lockstep."""

    task: Task
    seed: int
    episode_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # into the trajectory's meta (``sample``: its index in the group)

    @property
    def sample(self) -> int:
        return int(self.meta.get("sample", 0))

    def with_meta(self, meta: dict[str, Any]) -> EpisodeJob:
        """The same episode with another ``meta``."""
        return dataclasses.replace(self, meta=meta)


class _Rounds:
    """Collects one model call from every unfinished episode, then serves them in one batch."""

    def __init__(self, policy, n: int):  # any policy with generate_batch(prompts, seeds=...)
        self.policy = policy
        self.live = n
        self.pending: dict[int, PolicyRequest] = {}
        self.results: dict[int, PolicyOutput | Exception] = {}
        self.cond = threading.Condition()  # its lock is held by the one episode thread that runs
        self.batches: list[int] = []  # rows per batched call (what the speed-up rests on)

    def call(self, i: int, request: PolicyRequest) -> PolicyOutput:  # called holding self.cond
        self.pending[i] = request
        self._serve_if_complete()
        self.cond.wait_for(lambda: i in self.results)
        out = self.results.pop(i)
        if isinstance(out, BaseException):  # the batched call failed: every episode in it sees the error
            raise out
        return out

    def finished(self) -> None:  # called holding self.cond
        self.live -= 1
        self._serve_if_complete()

    def _serve_if_complete(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        order = sorted(self.pending)
        requests = [self.pending.pop(i) for i in order]
        try:
            outs = self.policy.generate_batch([r.prompt_ids for r in requests], seeds=[r.seed for r in requests])
        except Exception as e:  # noqa: BLE001 — handed to every waiting episode, none is left waiting
            outs = [e] * len(order)
        self.results.update(zip(order, outs, strict=True))
        self.batches.append(len(order))
        self.cond.notify_all()


class _Seat:
    """The policy one episode sees: its calls go through the rounds."""

    def __init__(self, rounds: _Rounds, index: int):
        self.rounds, self.index = rounds, index
        self.name = rounds.policy.name

    def start(self, task: Task | None = None) -> None:
        pass

    def config(self) -> dict[str, Any]:
        return self.rounds.policy.config()

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        return self.rounds.call(self.index, request)


def run_episodes(env: Environment, jobs: list[EpisodeJob], policy, tokenizer,
                 config: HarnessConfig) -> list[Trajectory]:
    """:func:`~memorywalker.rollout.episodes.harness.run_episode` for every job, in lockstep with batched model
    calls; returns the trajectories in job order. Each episode gets ``copy.copy(env)``: an environment
    whose ``reset`` rebinds its per-episode state (every bundled one) needs nothing more; one that
    mutates shared state in place must define ``__copy__``. An error in one episode is raised after the
    others finish."""
    rounds = _Rounds(policy, len(jobs))
    trajs: list[Trajectory | None] = [None] * len(jobs)
    errors: list[BaseException] = []

    def body(i: int, job: EpisodeJob) -> None:
        with rounds.cond:
            try:
                trajs[i] = run_episode(copy.copy(env), job.task, _Seat(rounds, i), tokenizer, config, seed=job.seed,
                                       episode_id=job.episode_id, meta=job.meta)
            except BaseException as e:  # noqa: BLE001 — re-raised below, after the other episodes end
                errors.append(e)
            finally:
                rounds.finished()

    threads = [threading.Thread(target=body, args=(i, job), daemon=True) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return trajs  # type: ignore[return-value]
