"""``corpus``'s scripted expert: an oracle that opens the gold evidence and answers the gold answer."""

from __future__ import annotations

from typing import Any

from memorywalker.records.schema import Message, Task
from memorywalker.rollout.environments.corpus.documents import FAILED
from memorywalker.rollout.environments.experts import Frames, notes_block, reply
from memorywalker.samplers.base import PolicyOutput, PolicyRequest


class CorpusExpert:
    """An **oracle**: it reads the task's gold evidence ids and gold answer (``task.meta``), searches
    the question once, opens every evidence document (part 1), then answers the gold answer.

    So its reward is 1.0 whenever the episode reaches the answer (within ``max_steps``, under the hard
    context window); what its episodes show is the harness: the calls, the compressions and what each
    delivered context held. It notes every result (``- [docid] title | opened``) in each response,
    summarizes as its notes, retries a lookup whose observation failed, was stale or was dropped by the
    harness before it was read, up to ``max_tries`` times, and under
    ``tc-rag`` wraps each lookup in a ``push``/``pop`` frame.
    """

    name = "expert"
    max_tries = 4  # failed tries of one lookup before it is skipped

    def start(self, task: Task) -> None:
        self.question, self.answer = task.meta["question"], task.answer or ""
        self.evidence: list[str] = list(task.meta["evidence"])
        self.plan: list[tuple[str, dict[str, Any]]] = [("search", {"query": self.question})]
        self.plan += [("open", {"docid": d}) for d in self.evidence]
        self.cursor, self.tries = 0, 0
        self.pending: str | None = None  # the lookup whose observation we wait for
        self.processed: set[str] = set()
        self.notes: list[str] = []
        self.opened = 0
        self.frames = Frames()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "env": "corpus"}

    def _observe(self, messages: list[Message]) -> None:
        last = next((m for m in reversed(messages) if m.role == "tool"), None)
        if self.pending is None:
            return
        action, self.pending = self.pending, None
        # The newest observation is not this lookup's when the harness dropped it before it was read.
        gone = last is None or last.name != action or (last.tool_call_id or last.id) in self.processed
        if not gone:
            self.processed.add(last.tool_call_id or last.id)
        if gone or last.content.startswith(FAILED):
            self.tries += 1
            if self.tries < self.max_tries:
                return
        elif action == "search":
            ids = [line.split("]", 1)[0].split("[", 1)[-1] for line in last.content.splitlines()[1:]]
            self.notes.append(f"- search | results: {', '.join(ids) or 'none'}")
        else:
            self.notes.append(f"- {last.content.splitlines()[0]} | opened")
            self.opened += 1
        self.cursor, self.tries, self.frames.unit_done = self.cursor + 1, 0, True

    def _next_action(self, tools: list[str]) -> tuple[str, dict[str, Any]]:
        done = self.cursor >= len(self.plan)
        frame = self.frames.action(tools, done=done, notes="\n".join(self.notes), label=self._label)
        if frame is not None:
            return frame
        if done:
            return "answer", {"text": self.answer}
        return self.plan[self.cursor]

    def _label(self) -> str:
        name, args = self.plan[self.cursor]
        return f"{name} {next(iter(args.values()))}"[:80]

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        self._observe(request.messages)
        notes = "\n".join(self.notes)
        if request.purpose != "act":
            text = (f"Question: {self.question}\nProgress: {self.opened} of {len(self.evidence)} evidence "
                    f"documents opened.\nNotes:\n{notes or '- none'}")
            return reply(text)
        name, args = self._next_action(request.tools)
        self.frames.called(name)
        if name not in ("push", "pop", "answer"):
            self.pending = name
        return reply(notes_block(notes), (name, args))
