"""Fault injection: an environment wrapper that makes tool calls fail the way real tools do (opt-in).

Three kinds, each replacing the observation of one ``search``/``open`` call:

* ``error`` — ``Error: search failed (HTTP 503 Service Unavailable). Try again.``
* ``timeout`` — ``Error: open timed out after 30 s. Try again.``
* ``stale`` — the previous observation of the same tool, served again from a stale cache (a fresh
  ``timeout`` when there is none yet).

Which calls fail is seeded: call ``n`` of an episode on task ``t`` fails when
``u(seed, t, n) < rate`` (a hash, not an RNG stream), so episodes do not depend on the order they run in.
The faulted observation is an ordinary tool message (context: loss mask 0) tagged ``meta.fault``; the
policy's next response — the recovery — is an ordinary target.

>>> from memorywalker.rollout.environments.websearch.env import WebSearchEnv
>>> env = FaultInjector(WebSearchEnv(0), FaultConfig(rate=1.0, kinds=("error",)))
>>> _ = env.reset(env.task("lookup", 0))
>>> r = env.step("search", {"query": "anything"})
>>> r.observation, r.info
('Error: search failed (HTTP 503 Service Unavailable). Try again.', {'fault': 'error'})
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task, ToolSchema
from memorywalker.rollout.environments.base import Environment, StepResult
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.samplers.base import Policy

FAULT_KINDS = ("error", "timeout", "stale")
FAULTED_TOOLS = ("search", "open")  # answer is never faulted: it ends the episode


@dataclass
class FaultConfig:
    rate: float = 0.1  # probability that one search/open call is faulted
    kinds: tuple[str, ...] = FAULT_KINDS  # drawn uniformly among these
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rate <= 1:
            raise InputError(f"fault rate must be in [0, 1], got {self.rate}")
        bad = [k for k in self.kinds if k not in FAULT_KINDS]
        if bad or not self.kinds:
            raise InputError(f"unknown fault kinds {bad}; valid: {', '.join(FAULT_KINDS)}")
        self.kinds = tuple(self.kinds)


def fault_draw(seed: int, task_id: str, n: int) -> tuple[float, float]:
    """Two uniforms in [0, 1) for call ``n`` of an episode on ``task_id``: (whether, which kind)."""
    a = call_seed(seed, "fault", task_id, n) / 2 ** 63
    b = call_seed(seed, "kind", task_id, n) / 2 ** 63
    return a, b


class FaultInjector(Environment):
    """``env`` with seeded tool faults; everything else (tasks, tools, prompt, reward) is ``env``'s."""

    def __init__(self, env: Environment, config: FaultConfig):
        self.env, self.fault_config = env, config
        self.name, self.system_prompt, self.suites = env.name, env.system_prompt, env.suites
        self.injected: list[dict[str, Any]] = []  # this episode's faults: call number, tool, kind

    def tools(self) -> list[ToolSchema]:
        return self.env.tools()

    def task(self, suite: str, index: int) -> Task:
        return self.env.task(suite, index)

    def reset(self, task: Task) -> str:
        self._task_id, self._n, self._last = task.id, 0, {}
        self.injected = []
        return self.env.reset(task)

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if name not in FAULTED_TOOLS:
            return self.env.step(name, arguments)
        self._n += 1
        whether, which = fault_draw(self.fault_config.seed, self._task_id, self._n)
        if whether >= self.fault_config.rate:
            result = self.env.step(name, arguments)
            if not result.observation.startswith("Error"):
                self._last[name] = result.observation
            return result
        kinds = self.fault_config.kinds
        kind = kinds[int(which * len(kinds))]
        if kind == "stale" and name not in self._last:
            kind = "timeout"  # nothing cached yet to serve stale
        if kind == "error":
            obs = f"Error: {name} failed (HTTP 503 Service Unavailable). Try again."
        elif kind == "timeout":
            obs = f"Error: {name} timed out after 30 s. Try again."
        else:
            obs = "Warning: served from a stale cache; this may not answer your request.\n" + self._last[name]
        self.injected.append({"call": self._n, "tool": name, "kind": kind})
        return StepResult(obs, info={"fault": kind})

    def expert(self) -> Policy:
        return self.env.expert()  # the wrapped environment's: faults change observations, not the task

    def config(self) -> dict[str, Any]:
        return {**self.env.config(), "faults": asdict(self.fault_config)}
