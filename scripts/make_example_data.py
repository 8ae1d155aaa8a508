"""Write the bundled example dataset used by `memorywalker inspect` with no arguments.

    python scripts/make_example_data.py

Three hand-written web-search episodes: one without compression, one whose history is summarized
once (claude-code style), and one where old tool outputs are first replaced by a placeholder and then
summarized (opencode style), with a refused proposal and a cut-off response.
"""

from pathlib import Path

from memorywalker.records import Task, ToolSchema, TrajectoryBuilder, write_trajectories

OUT = Path(__file__).resolve().parents[1] / "src/memorywalker/data/examples/websearch-compressed.jsonl"
TOOLS = [
    ToolSchema(name="search", description="Search the web.",
               parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
    ToolSchema(name="open", description="Open a page by id.",
               parameters={"type": "object", "properties": {"page": {"type": "string"}}, "required": ["page"]}),
    ToolSchema(name="answer", description="Give the final answer.",
               parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
]
SYSTEM = "You are a research agent. Use the tools, keep short notes, and answer with the answer tool."


def step(b, ctx, k, name, args, result, *, note=""):
    """One tool step: the assistant calls `name`, the tool answers; returns the new context."""
    a = b.message("assistant", note, tool_calls=[{"id": f"tc{k}", "name": name, "arguments": args}])
    b.call(list(ctx), a, finish_reason="tool_calls")
    o = b.message("tool", result, tool_call_id=f"tc{k}", name=name)
    return [*ctx, a, o]


def plain():
    b = TrajectoryBuilder("example-none", task=Task(id="q1", group="q1", split="train", suite="single-fact",
                                                     answer="1841"), tools=TOOLS)
    ctx = [b.message("system", SYSTEM), b.message("user", "In which year was Port Vesna founded?")]
    ctx = step(b, ctx, 0, "search", {"query": "Port Vesna founded"},
               "1. page-7: Port Vesna was founded in 1841 by a group of traders.\n2. page-3: The river flows north.")
    a = b.message("assistant", "", tool_calls=[{"id": "tc1", "name": "answer", "arguments": {"text": "1841"}}])
    b.call(ctx, a, finish_reason="tool_calls")
    b.reward = 1.0
    return b.build()


def summarized():
    b = TrajectoryBuilder("example-summarize", task=Task(id="q2", group="q2", split="train", suite="two-hop",
                                                          answer="48,200"), tools=TOOLS)
    sys_, user = b.message("system", SYSTEM), b.message("user", "What is the population of the city where "
                                                                "Alder Works is based?")
    ctx = [sys_, user]
    ctx = step(b, ctx, 0, "search", {"query": "Alder Works"},
               "1. page-12: Alder Works, founded by Mira Quell, is based in Port Vesna. It makes looms, "
               "gears and wheels, and employs several hundred people across three workshops.")
    ctx = step(b, ctx, 1, "open", {"page": "page-12"},
               "Alder Works is a maker of looms. Its founder is Mira Quell. Its home is Port Vesna, a city "
               "on the north river. The works were extended twice and the old mill was sold.",
               note="Note: Alder Works is based in Port Vesna.")
    summary = b.message("user", "Summary of the conversation so far: the user asks for the population of the "
                        "city where Alder Works is based. Found: Alder Works is based in Port Vesna.",
                        author="harness")
    b.eviction("call-2", "summarize", removed=ctx[2:], inserted=[summary], trigger="auto",
               tokens_before=260, tokens_after=120)
    ctx = step(b, [sys_, user, summary], 2, "search", {"query": "Port Vesna population"},
               "1. page-4: Port Vesna has a population of 48,200.")
    a = b.message("assistant", "", tool_calls=[{"id": "tc3", "name": "answer", "arguments": {"text": "48,200"}}])
    b.call(ctx, a, finish_reason="tool_calls")
    b.reward = 1.0
    return b.build()


def pruned_then_summarized():
    b = TrajectoryBuilder("example-prune-summarize", task=Task(id="q3", group="q3", split="train",
                                                               suite="comparison", answer="Port Vesna"),
                          tools=TOOLS)
    sys_, user = b.message("system", SYSTEM), b.message("user", "Which town is older, Port Vesna or Dunmere?")
    ctx = [sys_, user]
    ctx = step(b, ctx, 0, "search", {"query": "Port Vesna founded"},
               "1. page-7: Port Vesna was founded in 1841 by a group of traders who came down the river.")
    ctx = step(b, ctx, 1, "search", {"query": "Dunmere founded"},
               "1. page-9: Dunmere was founded in 1903, after the railway reached the valley.",
               note="Note: Port Vesna 1841.")
    # A refused proposal: the harness rejected this call (e.g. a permission prompt); it stays context.
    refused = b.message("assistant", "", tool_calls=[{"id": "tc2", "name": "open", "arguments": {"page": "x"}}])
    b.call(ctx, refused, finish_reason="tool_calls", selected=False, reason="refused proposal")
    placeholder = b.message("tool", "[Old tool result content cleared]", tool_call_id="tc0", name="search",
                            author="harness")
    b.eviction("call-3", "placeholder", removed=[ctx[3]], inserted=[placeholder], trigger="budget")
    ctx = [sys_, user, ctx[2], placeholder, ctx[4], ctx[5]]
    cut = b.message("assistant", "Port Vesna (1841) is older than Dunmere (19")
    b.call(ctx, cut, finish_reason="length")
    summary = b.message("user", "Summary: Port Vesna was founded in 1841, Dunmere in 1903.", author="harness")
    b.eviction("call-4", "summarize", removed=ctx[2:], inserted=[summary], trigger="auto")
    a = b.message("assistant", "", tool_calls=[{"id": "tc3", "name": "answer", "arguments": {"text": "Port Vesna"}}])
    b.call([sys_, user, summary], a, finish_reason="tool_calls")
    b.reward = 1.0
    return b.build()


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    n = write_trajectories(OUT, [plain(), summarized(), pruned_then_summarized()])
    print(f"wrote {n} trajectories to {OUT}")
