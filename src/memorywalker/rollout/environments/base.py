"""The environment interface a rollout runs against, and the reward every suite uses.

Implement :class:`Environment` to roll out on your own tasks::

    class Calculator(Environment):
        system_prompt = "Compute the answer with the tools, then call answer."

        def tools(self):
            return [ToolSchema(name="add", parameters={...}), ToolSchema(name="answer", parameters={...})]

        def task(self, suite, index):
            a, b = index, index + 1
            return Task(id=f"add-{index}", group=f"add-{index}", suite=suite, answer=str(a + b),
                        meta={"question": f"What is {a} + {b}?"})

        def reset(self, task):
            self.gold = task.answer
            return task.meta["question"]

        def step(self, name, arguments):
            if name == "answer":
                r = exact_match(str(arguments.get("text", "")), self.gold)
                return StepResult("Answer recorded.", done=True, reward=r)
            ...

The harness owns the conversation (messages, compression, recording); the environment only sees tool
calls and returns observations. A tool call the environment cannot serve returns an ``Error: ...``
observation instead of raising, so a malformed action never ends a rollout.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task, ToolSchema
from memorywalker.samplers.base import Policy


@dataclass
class StepResult:
    """What one tool call returns: the observation text, whether the episode ended, and its reward."""

    observation: str
    done: bool = False
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """An episodic tool-use environment.

    ``task(suite, index)`` names a task deterministically; ``reset(task)`` starts an episode on it and
    returns the task prompt (the first user message); ``step(name, arguments)`` executes one tool call.
    """

    name: str = "env"
    system_prompt: str = "You are a helpful assistant. Use the tools to solve the task."
    suites: tuple[str, ...] = ()

    @abstractmethod
    def tools(self) -> list[ToolSchema]:
        """The tools this environment serves (OpenAI function format)."""

    @abstractmethod
    def task(self, suite: str, index: int) -> Task:
        """Task number ``index`` of ``suite``; the same arguments always give the same task."""

    @abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode on ``task``; return the task prompt."""

    @abstractmethod
    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        """Execute one tool call; never raise on bad input (return an ``Error: ...`` observation)."""

    def config(self) -> dict[str, Any]:
        """What identifies this environment in a trajectory record."""
        return {"name": self.name}

    def expert(self) -> Policy:
        """This environment's scripted expert (``--sampler expert``); one without an expert of its own raises
        (another environment's expert would act on tools and tasks it does not know)."""
        raise InputError(f"env {self.name!r} has no scripted expert; choose a model sampler (hf:DIR, vllm:DIR, "
                         "openai:URL)")


def tool(name: str, description: str, required: dict[str, str], optional: dict[str, str] | None = None) -> ToolSchema:
    """A function tool whose arguments are ``required`` and ``optional`` (name -> JSON type), in that order.

    >>> tool("open", "Open a box.", {"box": "string"}).parameters
    {'type': 'object', 'properties': {'box': {'type': 'string'}}, 'required': ['box']}
    """
    properties = {arg: {"type": kind} for arg, kind in {**required, **(optional or {})}.items()}
    return ToolSchema(name=name, description=description,
                      parameters={"type": "object", "properties": properties, "required": list(required)})


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, articles and thousands separators, collapse spaces.

    >>> normalize_answer("  The Velka Works. ")
    'velka works'
    >>> normalize_answer("48,200")
    '48200'
    """
    s = text.lower().strip()
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    s = re.sub(r"[^\w\s]", " ", s)
    s = re.sub(r"\b(the|a|an)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    """Reward = 1.0 when the normalized strings are equal, else 0.0.

    >>> exact_match("velka works", "Velka Works"), exact_match("1903.", "1904")
    (1.0, 0.0)
    """
    return float(normalize_answer(prediction) == normalize_answer(gold))


def split_of(group: str, *, valid: float = 0.1, test: float = 0.1) -> str:
    """Train/valid/test split of a task group, stable across runs and machines (a hash, not an RNG).

    >>> split_of("lookup:velka-works:founded") in ("train", "valid", "test")
    True
    """
    u = int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) / 0x1_0000_0000
    return "test" if u < test else "valid" if u < test + valid else "train"
