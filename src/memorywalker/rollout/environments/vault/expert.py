"""``vault``'s scripted expert: opens the task's boxes in order and answers from the notes its context shows."""

from __future__ import annotations

import random
import re
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task
from memorywalker.rollout.environments.experts import reply
from memorywalker.samplers.base import PolicyOutput, PolicyRequest

NOTES_RE = re.compile(r"^Notes:(.*)$", re.M)
PAIR_RE = re.compile(r"(\w+) (\w+)")
OBS_RE = re.compile(r"^The label reads: (\w+) (\w+)$", re.M)
QUESTION_RE = re.compile(r"Report the codes of boxes ([\w, ]+)\.")
NEXT_RE = re.compile(r"^Next: open (\w+)$", re.M)


def pairs_text(pairs: list[tuple[str, str]]) -> str:
    """How notes, summaries and answers write boxes and codes.

    >>> pairs_text([("kal", "amber"), ("mor", "teal")])
    'kal amber, mor teal'
    """
    return ", ".join(f"{box} {code}" for box, code in pairs)


class VaultExpert:
    """Opens the task's boxes in order and answers from the notes its context shows.

    Every response is computed from the delivered context alone (and, with ``forget``, the episode's
    draw of carelessness) — the question, the ``Notes:`` lines of assistant turns and harness artifacts
    (summaries), plus the box observations still in the context — and restates all notes, so it
    succeeds exactly when the harness keeps them.
    A summary adds what remains to do (``Next: open mor``): the act call after a compaction follows the
    summary — it opens the box the summary names next, or answers when the summary names none.

    ``forget``: the fraction of episodes (drawn per task, reproducibly) in which the expert is a careless
    summarizer, as real logs have them: its summaries keep only the labels the observations still in the
    context show and drop the notes carried from earlier, so the answer misses the boxes opened before the
    previous compaction. Imitation learns that habit at the rate the logs show it; the reward does not.
    """

    name = "expert"

    def __init__(self, forget: float = 0.0):
        if not 0.0 <= forget <= 1.0:
            raise InputError(f"forget={forget}: a fraction of episodes, in [0, 1]")
        self.forget = forget
        self._careless = False

    def start(self, task: Task) -> None:
        self._careless = random.Random(f"vault-forget-{task.id}").random() < self.forget

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "env": "vault", **({"forget": self.forget} if self.forget else {})}

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        notes: dict[str, str] = {}
        seen: dict[str, str] = {}  # labels the observations in the context show
        boxes: list[str] = []
        summary = None  # the latest summary the harness inserted (an artifact with notes)
        for m in request.messages:
            if m.role == "user" and not boxes and (q := QUESTION_RE.search(m.content)):
                boxes = q.group(1).split(", ")
            if m.is_artifact and NOTES_RE.search(m.content):
                summary = m.content
            if m.role == "assistant" or m.is_artifact:
                for line in NOTES_RE.findall(m.content):
                    notes.update(PAIR_RE.findall(line))
            elif m.role == "tool":
                seen.update(OBS_RE.findall(m.content))
        notes.update(seen)
        todo = [b for b in boxes if b not in notes]
        if request.purpose != "act":  # a summary: the notes and what remains to do
            kept = seen if self._careless else notes
            text = pairs_text([(b, kept[b]) for b in boxes if b in kept])
            lines = [f"Notes: {text or 'none'}"] + ([f"Next: open {todo[0]}"] if todo else [])
            return reply("\n".join(lines))
        if summary is not None:  # follow the summary: from the box it names next, or answer if it names none
            nxt = NEXT_RE.search(summary)
            start = boxes.index(nxt.group(1)) if nxt and nxt.group(1) in boxes else len(boxes)
            todo = [b for b in boxes[start:] if b not in notes]
        known = pairs_text([(b, notes[b]) for b in boxes if b in notes])
        text = f"Notes: {known}" if known else ""
        return reply(text, ("open", {"box": todo[0]}) if todo else ("answer", {"text": known}))
