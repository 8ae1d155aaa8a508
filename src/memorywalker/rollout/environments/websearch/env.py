"""``websearch``: the offline web-search environment (search / open / answer over a seeded World).

>>> env = WebSearchEnv(world_seed=0)
>>> task = env.task("lookup", 0)
>>> prompt = env.reset(task)
>>> env.step("search", {"query": task.meta["program"]["steps"][0]["entity"]}).observation.startswith("Results")
True
"""

from __future__ import annotations

from typing import Any

from memorywalker.records.schema import Task, ToolSchema
from memorywalker.rollout.environments.base import Environment, StepResult, exact_match, tool
from memorywalker.rollout.environments.websearch.expert import ExpertPolicy
from memorywalker.rollout.environments.websearch.suites import SUITES, make_task
from memorywalker.rollout.environments.websearch.world import World

SYSTEM_PROMPT = (
    "You are a research assistant. Use the tools to search the web, open pages and answer the question. "
    "Pages start with a Facts box; links show the page id in brackets. Before each tool call, write short "
    "notes of what you have learned, one per line as '- Entity | attribute: value'. "
    "Call answer once you know the answer."
)

TOOLS = [
    tool("search", "Search the web. Returns page ids, titles and snippets.", {"query": "string"}),
    tool("open", "Open a page by its id.", {"page": "string"}),
    tool("answer", "Give the final answer. Ends the episode.", {"text": "string"}),
]


class WebSearchEnv(Environment):
    name = "websearch"
    system_prompt = SYSTEM_PROMPT
    suites = tuple(SUITES)

    def __init__(self, world_seed: int = 0, *, search_k: int = 5, snippet_chars: int = 80,
                 world_size: dict[str, int] | None = None):
        # world_size: World.generate's n_cities / n_companies / n_people / n_distractors (a smaller
        # world is an easier one, e.g. for a tiny model trained on a CPU).
        self.world_size = dict(world_size or {})
        self.world = World.generate(world_seed, **self.world_size)
        self.world_seed = world_seed
        self.search_k = search_k
        self.snippet_chars = snippet_chars
        self._gold: str | None = None

    def tools(self) -> list[ToolSchema]:
        return list(TOOLS)

    def task(self, suite: str, index: int) -> Task:
        return make_task(self.world, suite, index)

    def reset(self, task: Task) -> str:
        self._gold = task.answer
        return task.meta["question"]

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        arg = {"search": "query", "open": "page", "answer": "text"}.get(name)
        if arg is None:
            return StepResult(f"Error: unknown tool {name!r}. Valid tools: search, open, answer.")
        value = arguments.get(arg) if isinstance(arguments, dict) else None
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            return StepResult(f"Error: {name} needs a string argument {arg!r}.")
        value = str(value)
        if name == "search":
            pages = self.world.search(value, k=self.search_k)
            if not pages:
                return StepResult(f"No results for {value!r}.")
            lines = [f"Results for {value!r}:"]
            for i, p in enumerate(pages, 1):
                body = " ".join(p.text.split("\n", 1)[-1].split())
                lines.append(f"{i}. [{p.id}] {p.title}: {body[: self.snippet_chars]}...")
            return StepResult("\n".join(lines))
        if name == "open":
            page = self.world.pages.get(value.strip().strip("[]"))
            if page is None:
                return StepResult(f"Error: no page {value!r}. Use a page id from the search results.")
            return StepResult(page.text)
        reward = exact_match(value, self._gold or "")
        return StepResult(f"Answer recorded: {value}", done=True, reward=reward, info={"answer": value})

    def expert(self) -> ExpertPolicy:
        return ExpertPolicy()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "world_seed": self.world_seed, "search_k": self.search_k,
                **({"world_size": self.world_size} if self.world_size else {})}
