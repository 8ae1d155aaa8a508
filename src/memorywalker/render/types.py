"""What rendering produces: per-token role labels, rendered calls and trajectories, and the Hugging Face
message/tool dicts chat templates take. Shared by the renderer (``render.py``) and the full view
(``fullview.py``), which builds on the renderer without importing it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Message, ToolSchema, Trajectory

if TYPE_CHECKING:
    from memorywalker.render.fullview import FullView

# Role/span labels of tokens. ``artifact`` = text a harness inserted (summaries, placeholders);
# ``template`` = scaffolding outside every message (the generation prompt); ``context`` = recorded
# context tokens whose per-message spans could not be verified.
ROLES = ("system", "user", "assistant", "tool", "artifact", "template", "context")
ROLE_ID = {r: i for i, r in enumerate(ROLES)}

@dataclass
class RenderedCall:
    """``S_t`` of one call with a label per token and the target positions inside it."""

    index: int  # position of the call in its trajectory
    call_id: str
    tokens: list[int]
    roles: list[int]  # ROLE_ID per token
    prompt_len: int  # tokens[prompt_len:] is the response
    targets: list[int]  # positions (into tokens) of supervised tokens
    target_logprobs: list[float | None]  # rollout logprob of each target, when recorded
    selected: bool
    reason: str | None = None  # why the call has no targets
    span_method: str = "incremental"  # "incremental" | "search" | "recorded"
    warnings: list[str] = field(default_factory=list)
    # With recorded ids: the response as the template renders and the tokenizer tokenizes it, which a
    # sampled response may not be (models can emit non-canonical tokenizations of the same text).
    rendered_response: list[int] | None = None

    @property
    def response_start(self) -> int:
        return self.prompt_len


@dataclass
class RenderedTrajectory:
    trajectory: Trajectory
    calls: list[RenderedCall]
    # The uncompressed transcript with each response located in it (SDCC); built by
    # ``Renderer.render(traj, full_view=True)``.
    full_view: FullView | None = None

    @property
    def id(self) -> str:
        return self.trajectory.id

    @property
    def zero_target_calls(self) -> list[tuple[str, str]]:
        return [(c.call_id, c.reason or "no_targets") for c in self.calls if not c.targets]


class RenderError(InputError):
    pass


def calls_left_out(rendered: Iterable[RenderedTrajectory], *, logprobs: bool = False) -> dict[str, int]:
    """The calls that give no target, by reason: ``truncated`` (cut at the length limit; left out unless
    rendered with ``truncated="prefix"``), ``unselected: <why>`` (a log's own verdict: the billed-token
    check, a refused proposal...), ``empty_response``, and the renderer's other reasons; with ``logprobs``,
    also the calls with targets but no recorded rollout logprobs (``no rollout logprobs``).

    >>> rc = RenderedCall(0, "c0", [1], [0], 1, [], [], False, reason="not_selected: context_unverified: ...")
    >>> calls_left_out([RenderedTrajectory(None, [rc])])
    {'unselected: context_unverified': 1}
    """
    out: Counter = Counter()
    for rt in rendered:
        for rc in rt.calls:
            if not rc.targets:
                why = (rc.reason or "no_targets").split(": ")
                out["unselected: " + why[1] if why[0] == "not_selected" and len(why) > 1 else why[0]] += 1
            elif logprobs and all(lp is None for lp in rc.target_logprobs):
                out["no rollout logprobs"] += 1
    return dict(sorted(out.items()))


def left_out_line(counts: dict[str, int], total: int, truncated: str = "exclude") -> str:
    """One line saying which calls a command left out of what it trains or measures, and why.

    >>> left_out_line({"truncated": 1}, 1)
    'calls left out: 1 of 1 (truncated 1); truncated: cut at the length limit (truncated=prefix keeps their tokens)'
    """
    if not counts:
        return f"calls left out: none of {total}"
    line = f"calls left out: {sum(counts.values())} of {total} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})"
    if counts.get("truncated") and truncated == "exclude":
        line += "; truncated: cut at the length limit (truncated=prefix keeps their tokens)"
    return line


def message_to_hf(m: Message) -> dict[str, Any]:
    """One schema-v1 message as the dict Hugging Face chat templates expect.

    >>> message_to_hf(Message(id="m1", role="user", content="hi"))
    {'role': 'user', 'content': 'hi'}
    """
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning:
        d["reasoning_content"] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
            for tc in m.tool_calls
        ]
    if m.role == "tool":
        d["tool_call_id"] = m.tool_call_id
        if m.name:
            d["name"] = m.name
    return d


def tools_to_hf(traj: Trajectory, names: list[str] | None) -> list[dict[str, Any]] | None:
    return schemas_to_hf(traj.tools if names is None else [t for t in traj.tools if t.name in set(names)])


def schemas_to_hf(table: list[ToolSchema]) -> list[dict[str, Any]] | None:
    """Tool schemas as the ``tools`` argument of chat templates (None when there are none)."""
    if not table:
        return None
    return [{"type": "function", "function": t.model_dump(mode="json")} for t in table]
