"""The scripted expert: executes a task's program against the pages it opens, keeping short notes.

The expert reads only what its context shows. Each observation is parsed when it first appears (in an
act call or in a summarization call, whichever comes first); every fact learned becomes a note line
``- Entity | attribute: value``. Every response restates all notes, summaries are the notes, and the
final answer is computed from the notes found *in the delivered context* (assistant turns and harness
artifacts), never from private memory. So the expert succeeds under a compression policy exactly when
that policy keeps its notes: the Done-means test that it solves >= 99 % of tasks under every policy
checks the harnesses as much as the expert.

Under ``tc-rag`` (tools ``push``/``pop`` offered) it opens a frame per lookup and pops it with its notes
as the summary once the fact is noted.
"""

from __future__ import annotations

import re
from typing import Any

from memorywalker.records.schema import Message, Task
from memorywalker.rollout.environments.experts import Frames, notes_block, reply
from memorywalker.rollout.environments.websearch.world import slug
from memorywalker.samplers.base import PolicyOutput, PolicyRequest

NOTE_RE = re.compile(r"^- (.+?) \| (.+?): (.*)$", re.M)
RESULT_RE = re.compile(r"^\d+\. \[([^\]]+)\] (.+?): ", re.M)
LINK_RE = re.compile(r"^(.*?) \[([^\]]+)\]$")


def read_notes(messages: list[Message]) -> dict[tuple[str, str], str]:
    """Notes found in the assistant turns and harness artifacts of a context (later ones win)."""
    notes: dict[tuple[str, str], str] = {}
    for m in messages:
        if m.role == "assistant" or m.is_artifact:
            for entity, attr, value in NOTE_RE.findall(m.content):
                notes[entity, attr] = value
    return notes


def read_facts(page_text: str) -> tuple[str, dict[str, str]]:
    """(title, facts) of a page: its first line and the ``- key: value`` lines of its Facts box."""
    lines = page_text.split("\n")
    facts: dict[str, str] = {}
    for line in lines[2:]:
        if not line.startswith("- "):
            break
        key, _, value = line[2:].partition(": ")
        facts[key] = value
    return lines[0], facts


def _link(value: str) -> tuple[str, str | None]:
    m = LINK_RE.match(value)
    return (m.group(1), m.group(2)) if m else (value, None)


class ExpertPolicy:
    name = "expert"
    max_tries = 6  # failed searches/opens of one step before giving up

    def start(self, task: Task) -> None:
        self.question = task.meta["question"]
        self.program = task.meta["program"]
        self.steps: list[dict[str, Any]] = self.program["steps"]
        self.combine: dict[str, Any] = self.program["combine"]
        self.entity: list[str | None] = [s.get("entity") for s in self.steps]  # entity each step is about
        self.page: list[str | None] = [s.get("page") for s in self.steps]  # its page id, once known
        self.link: list[tuple[str, str | None] | None] = [None] * len(self.steps)  # (name, page) of a link value
        self.cursor = 0
        self.pending: tuple[str, Any] | None = None  # the action whose observation we wait for
        self.processed: set[str] = set()  # tool_call_ids of observations already read
        self.notes: dict[tuple[str, str], str] = {}  # what the context shows + fresh facts
        self.fresh: dict[tuple[str, str], str] = {}  # facts read since the last response that wrote notes
        self.tries = 0
        self.failed = False
        # constraint search
        self.candidates: list[tuple[str, str]] | None = None
        self.cand = 0
        self.city_page: str | None = None
        self.frames = Frames()  # tc-rag's push/pop around each lookup

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    # --- reading observations ---------------------------------------------------------------------

    def _observe(self, messages: list[Message]) -> None:
        last = next((m for m in reversed(messages) if m.role == "tool" or m.author == "environment"), None)
        if last is None or self.pending is None:
            return
        key = last.tool_call_id or last.id
        if key in self.processed:
            return
        self.processed.add(key)
        action, arg = self.pending
        self.pending = None
        if self.combine["op"] == "constraint":
            self._observe_constraint(action, last.content)
        else:
            self._observe_step(action, arg, last.content)

    def _note(self, entity: str, attr: str, value: str) -> None:
        self.fresh[entity, attr] = value
        self.notes[entity, attr] = value
        self.frames.unit_done = True

    def _observe_step(self, action: str, step: int, text: str) -> None:
        want = self.entity[step]
        if action == "search":
            hits = {title: pid for pid, title in RESULT_RE.findall(text)}
            if want in hits:
                self.page[step] = hits[want]
            else:
                self.tries += 1
            return
        title, facts = read_facts(text)
        attr = self.steps[step]["attr"]
        if (want is not None and title != want) or attr not in facts:
            self.page[step] = None if self.steps[step].get("page") is None else self.page[step]
            self.tries += 1
            return
        self.entity[step] = title
        name, page = _link(facts[attr])
        self.link[step] = (name, page)
        self._note(title, attr, name)
        self.cursor += 1
        self.tries = 0
        if self.cursor < len(self.steps):  # resolve the next step's entity from this link
            nxt = self.steps[self.cursor]
            if "ref" in nxt:
                ref_name, ref_page = self.link[nxt["ref"]]
                self.entity[self.cursor], self.page[self.cursor] = ref_name, ref_page

    def _observe_constraint(self, action: str, text: str) -> None:
        city = self.combine["city"]
        if action == "search":
            hits = {title: pid for pid, title in RESULT_RE.findall(text)}
            self.city_page = hits.get(city)
            self.tries += self.city_page is None
            return
        if self.candidates is None and self.city_page is None:  # opened a guessed page id
            self.city_page = slug(city)
        title, facts = read_facts(text)
        if self.candidates is None:
            if title != city or "companies" not in facts:
                self.city_page, self.tries = None, self.tries + 1
                return
            self.candidates = [_link(c) for c in facts["companies"].split(", ") if c != "none"]
            self._note(city, "companies", ", ".join(n for n, _ in self.candidates))
            return
        name = self.candidates[self.cand][0]
        clues = self.combine["clues"]
        if title == name and all(_holds(facts.get(a), cmp, v) for a, cmp, v in clues):
            for attr, _, _ in clues:  # only the match is worth a note; the rest are just skipped
                self._note(name, attr, facts[attr])
        self.frames.unit_done = True
        self.cand += 1

    # --- acting -----------------------------------------------------------------------------------

    def _answer_from_notes(self, notes: dict[tuple[str, str], str]) -> str:
        op = self.combine["op"]
        try:
            if op == "constraint":
                for name in notes.get((self.combine["city"], "companies"), "").split(", "):
                    if name and all(_holds(notes.get((name, a)), cmp, v) for a, cmp, v in self.combine["clues"]):
                        return name
                return "unknown"
            values = [notes[self.entity[i], s["attr"]] for i, s in enumerate(self.steps)]
            if op == "last":
                return values[-1]
            if op == "sum":
                return str(sum(int(v) for v in values))
            if op == "count":
                return str(sum(v == self.combine["value"] for v in values))
            if op in ("argmin", "argmax"):
                nums = [int(v) for v in values]
                best = min(nums) if op == "argmin" else max(nums)
                return self.combine["names"][nums.index(best)]
        except (KeyError, ValueError, TypeError):
            pass
        return "unknown"

    def _done(self) -> bool:
        if self.failed:
            return True
        if self.combine["op"] == "constraint":
            if self.candidates is None:
                return False
            notes = self.notes
            found = any(all(_holds(notes.get((n, a)), cmp, v) for a, cmp, v in self.combine["clues"])
                        for n, _ in self.candidates[: self.cand])
            return found or self.cand >= len(self.candidates)
        return self.cursor >= len(self.steps)

    def _next_action(self, tools: list[str]) -> tuple[str, dict[str, Any]]:
        if self.tries >= self.max_tries:
            self.failed = True
        frame = self.frames.action(tools, done=self._done(), notes=self._notes_text(), label=self._unit_label)
        if frame is not None:
            return frame
        if self._done():
            return "answer", {}
        if self.combine["op"] == "constraint":
            city = self.combine["city"]
            if self.candidates is None:
                if self.city_page is None:
                    return self._find(city, "city founded population")
                return "open", {"page": self.city_page}
            name, page = self.candidates[self.cand]
            return "open", {"page": page or slug(name)}
        step = self.cursor
        if self.page[step] is not None:
            return "open", {"page": self.page[step]}
        return self._find(self.entity[step], "facts")

    def _find(self, name: str, extra: str) -> tuple[str, dict[str, Any]]:
        """Search for ``name``'s page: plain, then with extra words, then guess the id links use."""
        if self.tries >= 2:
            return "open", {"page": slug(name)}
        return "search", {"query": name if self.tries == 0 else f"{name} {extra}"}

    def _unit_label(self) -> str:
        if self.combine["op"] == "constraint":
            if self.candidates is None:
                return f"companies in {self.combine['city']}"
            return f"check {self.candidates[self.cand][0]}"
        return f"{self.entity[self.cursor] or self.page[self.cursor]} {self.steps[self.cursor]['attr']}"

    def _notes_text(self) -> str:
        return "\n".join(f"- {e} | {a}: {v}" for (e, a), v in self.notes.items())

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        # Facts come from the context only: the notes it shows plus what the newest observation says.
        self.notes = read_notes(request.messages)
        self.notes.update(self.fresh)
        self._observe(request.messages)
        notes = self._notes_text()
        self.fresh = {}  # written into this response (or summary) from here on
        if request.purpose != "act":
            done = self.cursor if self.combine["op"] != "constraint" else self.cand
            text = f"Question: {self.question}\nProgress: {done} lookups done.\nNotes:\n{notes or '- none'}"
            return reply(text)
        name, args = self._next_action(request.tools)
        self.frames.called(name)
        if name == "answer":
            args = {"text": self._answer_from_notes(self.notes)}
        elif name not in ("push", "pop"):
            self.pending = (name, self.cursor)
        return reply(notes_block(notes), (name, args))


def _holds(value: str | None, cmp: str, target: Any) -> bool:
    if value is None:
        return False
    if cmp == "=":
        return value == str(target)
    try:
        v = int(value)
    except ValueError:
        return False
    return v > int(target) if cmp == ">" else v < int(target)
