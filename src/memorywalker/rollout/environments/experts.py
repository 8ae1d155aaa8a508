"""What the scripted experts share: tc-rag's ``push``/``pop`` frame around each lookup, and the way they
write a response (text, and a tool call when acting)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memorywalker.records.schema import Message, ToolCall
from memorywalker.samplers.base import PolicyOutput


class Frames:
    """The frame a scripted expert keeps around each lookup when ``push`` and ``pop`` are offered (``tc-rag``).

    A frame is pushed before a lookup and popped, with the notes as its summary, once the lookup is done
    (``unit_done``, set by the expert when it learns something) or the task is.
    """

    def __init__(self) -> None:
        self.open = False
        self.unit_done = False

    def action(self, tools: list[str], *, done: bool, notes: str,
               label: Callable[[], str]) -> tuple[str, dict[str, Any]] | None:
        """``pop`` or ``push`` when one is due, else None (the expert acts or answers)."""
        if "push" not in tools or "pop" not in tools:
            return None
        if self.open and (self.unit_done or done):
            return "pop", {"summary": notes or "nothing learned"}
        if not self.open and not done:
            self.unit_done = False
            return "push", {"label": label()}
        return None

    def called(self, name: str) -> None:
        """Record a ``push``/``pop`` the expert makes (any other tool leaves the frame as it is)."""
        if name in ("push", "pop"):
            # A pop's own result leaves the context with its frame, so the stack state is tracked when the
            # call is made, not when its (possibly evicted) result is read.
            self.open, self.unit_done = name == "push", False


def reply(content: str, call: tuple[str, dict[str, Any]] | None = None) -> PolicyOutput:
    """An expert's response: ``content`` and, when acting, the tool call ``(name, arguments)``.

    >>> out = reply("Notes:\\n- a | b: c\\n", ("open", {"page": "a"}))
    >>> out.message.content, [(c.name, c.arguments) for c in out.message.tool_calls], out.finish_reason
    ('Notes:\\n- a | b: c\\n', [('open', {'page': 'a'})], 'stop')
    """
    calls = [ToolCall(id="", name=call[0], arguments=dict(call[1]))] if call is not None else []
    return PolicyOutput(message=Message(id="", role="assistant", content=content, author="model", tool_calls=calls),
                        finish_reason="stop")


def notes_block(notes: str) -> str:
    """The ``Notes:`` block a response opens with (nothing before the first note)."""
    return f"Notes:\n{notes}\n" if notes else ""
