"""Compression policies: what a harness does to the history when the context budget is exceeded.

Each policy models a real harness's documented behaviour; all keep the system prompt and the task.
``B`` = ``budget`` (tokens of the rendered prompt), ``w`` = ``watermark``, ``R`` = ``keep_recent``
(most recent steps protected; a step is one assistant turn and its tool results).

==============  =====================================================================  ==================
policy          behaviour (trigger: prompt tokens of the history before an act call)   eviction kinds
==============  =====================================================================  ==================
``none``        never compresses (a prompt over ``max_context`` ends the episode)      —
``claude-code`` > w·B: a summarization call of the model itself; history becomes       summarize
                system + task + summary (Claude Code auto-compact)
``opencode``    > w·B: tool outputs older than the last R steps become a fixed          placeholder,
                placeholder (OpenCode prune); if still > w·B, summarize as above        then summarize
``agentfold``   > w·B: the unfolded steps before the last R are folded into one block   fold
                written by a fold call (AgentFold granular folding); when nothing is
                left to fold, all blocks and steps are consolidated into one
``memex``       > w·B: tool outputs older than the last R steps move to an indexed      memory-offload
                store, a key stub stays in context; ``recall(key)`` brings one back
                (MemexRL indexed experience memory)
``tc-rag``      the agent ``push``es a frame and ``pop``s it with a summary; popped     prune
                messages leave the context (TC-RAG memory stack); no budget trigger
``qwen-agent``  > B: silently keep the newest messages that fit, truncate the newest    truncate
                tool result that does not fit to its head and tail, drop every older
                turn (Qwen-Agent ``_truncate_input_messages_roughly``)
==============  =====================================================================  ==================

An eviction replaces messages: ``meta["replaces"]`` maps each inserted message to the removed ones it
stands in for, and it takes the place of the first of them; removed messages not listed there are
dropped. :func:`apply_eviction` is that rule, and :func:`replay_contexts` rebuilds every call's
context of a recorded trajectory from call 0, the responses, the observations and the evictions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memorywalker.errors import InputError
from memorywalker.records.schema import ToolSchema, Trajectory
from memorywalker.rollout.environments.base import tool

if TYPE_CHECKING:
    from memorywalker.rollout.episodes.harness import Episode

CLAUDE_CODE_PROMPT = (
    "Your task is to create a detailed summary of the conversation so far. It will replace the "
    "conversation, so keep every fact needed to finish the task: the question, what was found (copy all "
    "notes as '- Entity | attribute: value' lines) and what remains to do. Do not call tools."
)
FOLD_PROMPT = (
    "Fold the steps above since the last folded block into one short block of notes "
    "('- Entity | attribute: value' lines) that keeps every fact needed to finish the task. Do not call tools."
)
SUMMARY_PREFIX = "This session is being continued from a previous conversation. Summary:\n"
FOLD_PREFIX = "[Folded steps]\n"


def apply_eviction(context: list[str], removed: list[str], replaces: dict[str, list[str]]) -> list[str]:
    """The context after one eviction.

    >>> apply_eviction(["s", "u", "a1", "t1", "a2", "t2"], ["a1", "t1", "t2"], {"S": ["a1", "t1"], "P": ["t2"]})
    ['s', 'u', 'S', 'a2', 'P']
    """
    gone = set(removed)
    at = {min(olds, key=context.index): new for new, olds in replaces.items()}
    out: list[str] = []
    for mid in context:
        if mid in at:
            out.append(at[mid])
        if mid not in gone:
            out.append(mid)
    return out


def replay_contexts(traj: Trajectory) -> list[list[str]]:
    """Rebuild every call's context from call 0's, the responses, observations and evictions.

    The history grows by each act call's response and the environment-authored messages recorded after
    it; evictions before a call rewrite it; side calls (summarize / fold) see the history plus their
    harness-authored request. Equality with the recorded contexts proves the eviction records complete.
    """
    index = {m.id: i for i, m in enumerate(traj.messages)}
    by_call: dict[str, list] = {}
    for ev in traj.evictions:
        by_call.setdefault(ev.before_call, []).append(ev)
    acts = [c for c in traj.calls if c.purpose == "act"]
    next_act = {a.id: (index[b.response] if b is not None else len(traj.messages))
                for a, b in zip(acts, [*acts[1:], None], strict=True)}
    history: list[str] = []
    out = []
    for i, call in enumerate(traj.calls):
        if i == 0:
            history = list(call.context) if call.purpose == "act" else []
        for ev in by_call.get(call.id, []):
            history = apply_eviction(history, ev.removed, ev.meta.get("replaces", {}))
        if call.purpose != "act":
            request = [mid for mid in call.context[len(history):]]
            out.append(history + request)
            continue
        out.append(list(history))
        lo, hi = index[call.response], next_act[call.id]
        history = history + [call.response] + [m.id for m in traj.messages[lo + 1:hi]
                                               if m.author == "environment"]
    return out


# --- policies -------------------------------------------------------------------------------------------

class Compressor:
    """Base: no compression and no extra tools."""

    name = "none"
    kinds: tuple[str, ...] = ()

    def tools(self) -> list[ToolSchema]:
        return []

    def handle(self, ep: Episode, name: str, arguments: dict[str, Any]) -> str | None:
        """Serve a harness tool call (``None``: not a harness tool)."""
        return None

    def before_call(self, ep: Episode) -> None:
        """Compress ``ep.history`` if needed, before the next act call."""


def _summarize_all(ep: Episode, trigger: str) -> None:
    before = ep.tokens(ep.history)
    summary = ep.side_call("summarize", CLAUDE_CODE_PROMPT)
    new = ep.add_artifact("user", SUMMARY_PREFIX + summary)
    old = ep.history[2:]
    ep.evict("summarize", old, {new: old}, trigger=trigger, tokens_before=before)


class ClaudeCode(Compressor):
    name = "claude-code"
    kinds = ("summarize",)

    def before_call(self, ep: Episode) -> None:
        if ep.tokens(ep.history) > ep.config.watermark * ep.config.budget and len(ep.history) > 2:
            _summarize_all(ep, "auto")


def _tool_results_outside_window(ep: Episode) -> list[str]:
    protected = {mid for step in ep.steps()[-ep.config.keep_recent:] for mid in step} if ep.config.keep_recent else set()
    return [mid for mid in ep.history[2:] if ep.msg(mid).role == "tool" and not ep.msg(mid).is_artifact
            and mid not in protected]


class OpenCode(Compressor):
    name = "opencode"
    kinds = ("placeholder", "summarize")

    def before_call(self, ep: Episode) -> None:
        limit = ep.config.watermark * ep.config.budget
        before = ep.tokens(ep.history)
        if before <= limit:
            return
        old = _tool_results_outside_window(ep)
        if old:
            replaces = {}
            for mid in old:
                m = ep.msg(mid)
                new = ep.add_artifact("tool", ep.config.placeholder, tool_call_id=m.tool_call_id, name=m.name)
                replaces[new] = [mid]
            ep.evict("placeholder", old, replaces, trigger="auto", tokens_before=before)
        if ep.tokens(ep.history) > limit:
            _summarize_all(ep, "overflow")


class AgentFold(Compressor):
    name = "agentfold"
    kinds = ("fold",)

    def before_call(self, ep: Episode) -> None:
        before = ep.tokens(ep.history)
        if before <= ep.config.watermark * ep.config.budget:
            return
        steps = ep.steps()
        keep = steps[-ep.config.keep_recent:] if ep.config.keep_recent else []
        foldable = steps[: len(steps) - len(keep)]
        blocks = [i for i, s in enumerate(foldable) if ep.msg(s[0]).is_artifact]
        run = [mid for s in foldable[(blocks[-1] + 1 if blocks else 0):] for mid in s]
        # Granular folding adds a block per fold; once ``max_fold_blocks`` exist (or nothing new is
        # left), merge every block and the new steps into one (deep consolidation).
        consolidate = not run or len(blocks) >= ep.config.max_fold_blocks
        if consolidate:
            run = [mid for s in foldable for mid in s]
            if len(run) < 2:
                return
        summary = ep.side_call("fold", FOLD_PROMPT)
        new = ep.add_artifact("user", FOLD_PREFIX + summary)
        ep.evict("fold", run, {new: run}, trigger="auto", tokens_before=before,
                 meta={"consolidate": consolidate})


class Memex(Compressor):
    name = "memex"
    kinds = ("memory-offload",)

    def __init__(self) -> None:
        self.store: dict[str, str] = {}

    def tools(self) -> list[ToolSchema]:
        return [tool("recall", "Read back a stored observation by its memory key.", {"key": "string"})]

    def handle(self, ep: Episode, name: str, arguments: dict[str, Any]) -> str | None:
        if name != "recall":
            return None
        key = str(arguments.get("key", ""))
        if key not in self.store:
            return f"Error: no memory with key {key!r}. Keys: {', '.join(self.store) or 'none'}."
        return self.store[key]

    def before_call(self, ep: Episode) -> None:
        before = ep.tokens(ep.history)
        if before <= ep.config.watermark * ep.config.budget:
            return
        old = _tool_results_outside_window(ep)
        if not old:
            return
        replaces = {}
        for mid in old:
            m = ep.msg(mid)
            key = f"mem-{len(self.store)}"
            self.store[key] = m.content
            head = m.content.split("\n", 1)[0][:60]
            stub = f"[memory {key}] {head} (stored; call recall with key {key} to read it)"
            new = ep.add_artifact("tool", stub, tool_call_id=m.tool_call_id, name=m.name, meta={"key": key})
            replaces[new] = [mid]
        ep.evict("memory-offload", old, replaces, trigger="auto", tokens_before=before,
                 meta={"keys": [ep.msg(n).meta["key"] for n in replaces]})


class TCRag(Compressor):
    name = "tc-rag"
    kinds = ("prune",)

    def __init__(self) -> None:
        self.stack: list[tuple[str, str]] = []  # (assistant message id that pushed, label)
        self.pending_pop: tuple[str, str, str] | None = None  # (frame start, label, summary)

    def tools(self) -> list[ToolSchema]:
        return [
            tool("push", "Open a memory frame for a sub-task.", {"label": "string"}),
            tool("pop", "Close the top frame: its messages leave the context and the summary stays.",
                 {"summary": "string"}),
        ]

    def handle(self, ep: Episode, name: str, arguments: dict[str, Any]) -> str | None:
        if name == "push":
            label = str(arguments.get("label", ""))
            self.stack.append((ep.current_response, label))
            return f"Pushed frame {label!r} (depth {len(self.stack)})."
        if name == "pop":
            if not self.stack or self.pending_pop is not None:
                return "Error: the memory stack is empty." if not self.stack else "Error: one pop per turn."
            start, label = self.stack.pop()
            self.pending_pop = (start, label, str(arguments.get("summary", "")))
            return f"Popped frame {label!r}."
        return None

    def before_call(self, ep: Episode) -> None:
        if self.pending_pop is None:
            return
        start, label, summary = self.pending_pop
        self.pending_pop = None
        if start not in ep.history:  # the frame was already removed by an enclosing pop
            return
        before = ep.tokens(ep.history)
        frame = ep.history[ep.history.index(start):]
        new = ep.add_artifact("user", f"[Popped frame: {label}]\n{summary}")
        ep.evict("prune", frame, {new: frame}, trigger="agent", tokens_before=before, meta={"label": label})


class QwenAgent(Compressor):
    name = "qwen-agent"
    kinds = ("truncate",)

    def before_call(self, ep: Episode) -> None:
        budget = ep.config.budget
        before = ep.tokens(ep.history)
        if before <= budget:
            return
        # Rough per-message counts (content only), like Qwen-Agent; the pinned prefix is counted exactly.
        available = budget - ep.tokens(ep.history[:2])
        rest = ep.history[2:]
        kept: list[str] = []
        replaces: dict[str, list[str]] = {}
        for mid in reversed(rest):
            m = ep.msg(mid)
            n = ep.rough_tokens(m)
            if n <= available:
                kept.insert(0, mid)
                available -= n
                continue
            if m.role == "tool" and available >= ep.config.min_truncated_tokens:
                new = ep.add_artifact("tool", ep.truncate_both_sides(m.content, available),
                                      tool_call_id=m.tool_call_id, name=m.name)
                replaces[new] = [mid]
                kept.insert(0, mid)
                available = 0
                continue
            break
        # Turns are dropped whole: a kept tool result whose call was dropped goes too.
        while kept and ep.msg(kept[0]).role == "tool":
            replaces = {n: o for n, o in replaces.items() if o != [kept[0]]}
            kept.pop(0)
        removed = [mid for mid in rest if mid not in set(kept)] + [o[0] for o in replaces.values()]
        if removed:
            ep.evict("truncate", removed, replaces, trigger="budget", tokens_before=before)


COMPRESSORS: dict[str, Callable[[], Compressor]] = {
    "none": Compressor,
    "claude-code": ClaudeCode,
    "opencode": OpenCode,
    "agentfold": AgentFold,
    "memex": Memex,
    "tc-rag": TCRag,
    "qwen-agent": QwenAgent,
}


def make_compressor(name: str) -> Compressor:
    if name not in COMPRESSORS:
        raise InputError(f"unknown harness {name!r}; valid: {list(COMPRESSORS)}")
    return COMPRESSORS[name]()
