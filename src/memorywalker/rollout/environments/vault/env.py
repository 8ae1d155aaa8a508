"""``vault``: recall tasks a small model trained on a CPU learns, where compression decides the reward.

A task names ``k`` boxes; each box holds a code word that only its ``open`` observation shows, and the
answer pairs every box with its code::

    user:      Report the codes of boxes kal, mor, tis.
    assistant: <tool_call> open {"box": "kal"} </tool_call>
    tool:      The label reads: kal amber
               The box is dusty and its lid is loose. It holds 41 old keys and a torn map.
    assistant: Notes: kal amber
               <tool_call> open {"box": "mor"} </tool_call>
    ...
    assistant: Notes: kal amber, mor teal, tis rose
               <tool_call> answer {"text": "kal amber, mor teal, tis rose"} </tool_call>

Codes are drawn per task (a box's code differs between tasks), so a model cannot memorize them: it
has to copy each code from the observation into its notes, and the observations are what a harness
evicts first (Claude Code compaction summarizes the history, OpenCode pruning replaces old tool
results by a placeholder). The answer is right only for the codes the agent carried across every
compression in its own notes or summaries. The reward is graded: the fraction of the task's boxes the
answer pairs with their code, so GRPO groups have variance long before an agent solves whole tasks.

Names and codes are short words a byte-level BPE trained on this environment's text keeps as single
tokens (:meth:`VaultEnv.corpus`), episodes are short (``k`` + 1 act calls), and every note, summary
and answer is the previous notes plus the newest label, written the same way (``name code`` pairs):
each is a copy of text already in the context, the easiest skill for a tiny model trained on a CPU
(the demo's 0.85M-parameter model: docs/demo.md).

Suites: ``recall-2``, ``recall-3``, ``recall-4`` (``k`` boxes). :class:`~memorywalker.rollout.environments.vault.expert.VaultExpert`
(``vault/expert.py``) is the scripted expert: a pure function of the delivered context, so it succeeds exactly when its notes survive.
"""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task, ToolSchema
from memorywalker.rollout.environments.base import Environment, StepResult, normalize_answer, split_of, tool
from memorywalker.rollout.environments.vault.expert import VaultExpert, pairs_text

NAMES = ["kal", "mor", "tis", "ven", "dax", "lum", "pov", "rin", "sab", "tor", "bel", "cuz", "fen", "gil",
         "hap", "jor", "kiv", "lex", "mab", "nox", "orb", "pim", "quo", "ras", "sul", "tam", "vik", "wex",
         "yul", "zed", "bop", "dun"]
CODES = ["amber", "teal", "rose", "olive", "coral", "ivory", "slate", "plum", "jade", "ruby", "sand",
         "mint", "navy", "gold", "lime", "rust", "pearl", "ash", "moss", "wine"]
_FILLER = [
    "The box is dusty and its lid is loose.",
    "It holds {n} old keys and a torn map.",
    "A faded label on the side is no longer readable.",
    "The hinges creak when it is opened.",
    "Someone scratched the number {n} into the lid.",
    "It smells of oil and old paper.",
    "The lock was replaced in {year}.",
    "Dust covers a stack of {n} receipts inside.",
]
SUITES = {"recall-2": 2, "recall-3": 3, "recall-4": 4}

SYSTEM_PROMPT = (
    "Open each box the task names. Old tool results get removed, so before each call write 'Notes:' and every "
    "box and code you know, as 'box code' pairs. Then answer with the same pairs."
)

TOOLS = [
    tool("open", "Open a box.", {"box": "string"}),
    tool("answer", "Each box and its code.", {"text": "string"}),
]

def graded_reward(prediction: str, boxes: list[str], codes: list[str]) -> float:
    """Fraction of the task's boxes whose name the answer follows by the right code (first mention counts).

    >>> graded_reward("kal amber, mor mint, tis rose", ["kal", "mor", "tis"], ["amber", "teal", "rose"])
    0.6666666666666666
    >>> graded_reward("Mor teal. kal teal", ["kal", "mor"], ["amber", "teal"]), graded_reward("", ["kal"], ["amber"])
    (0.5, 0.0)
    """
    words = normalize_answer(prediction).split()
    said = {}
    for name, code in pairwise(words):
        said.setdefault(name, code)
    return sum(said.get(b) == c for b, c in zip(boxes, codes, strict=True)) / len(boxes)


class VaultEnv(Environment):
    name = "vault"
    system_prompt = SYSTEM_PROMPT
    suites = tuple(SUITES)

    def __init__(self, world_seed: int = 0, *, filler: int = 2):
        self.world_seed = world_seed
        self.filler = filler  # filler sentences per observation: longer observations compress sooner
        self._codes: dict[str, str] = {}
        self._task: Task | None = None
        self._rng = random.Random(0)  # filler of the current episode (reseeded by reset)

    def tools(self) -> list[ToolSchema]:
        return list(TOOLS)

    def task(self, suite: str, index: int) -> Task:
        if suite not in SUITES:
            raise InputError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
        rng = random.Random(f"vault-{self.world_seed}-{suite}-{index}")
        boxes = rng.sample(NAMES, SUITES[suite])
        codes = [rng.choice(CODES) for _ in boxes]
        question = f"Report the codes of boxes {', '.join(boxes)}."
        # A task is its boxes and their codes: the same boxes with other codes is another task (and may
        # land in another split; its answer differs, so nothing leaks).
        group = f"{suite}:{' '.join(boxes)}:{' '.join(codes)}"
        return Task(id=f"{suite}-{index:05d}", group=group, split=split_of(f"{self.world_seed}:{group}"),
                    suite=suite, answer=pairs_text(list(zip(boxes, codes, strict=True))),
                    meta={"question": question, "boxes": boxes, "codes": codes, "index": index,
                          "world_seed": self.world_seed})

    def reset(self, task: Task) -> str:
        self._task = task
        rng = random.Random(f"vault-contents-{self.world_seed}-{task.id}")
        # Boxes the task does not name hold codes too (opening one is a wasted step, not an error).
        self._codes = {n: rng.choice(CODES) for n in NAMES}
        self._codes.update(zip(task.meta["boxes"], task.meta["codes"], strict=True))
        self._rng = rng
        return task.meta["question"]

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if self._task is None:
            return StepResult("Error: no episode is running (reset first).")
        arg = {"open": "box", "answer": "text"}.get(name)
        if arg is None:
            return StepResult(f"Error: unknown tool {name!r}. Valid tools: open, answer.")
        value = arguments.get(arg) if isinstance(arguments, dict) else None
        if not isinstance(value, str):
            return StepResult(f"Error: {name} needs a string argument {arg!r}.")
        if name == "open":
            box = value.strip().lower()
            if box not in self._codes:
                return StepResult(f"Error: no box {value!r}.")
            filler = [s.format(n=self._rng.randint(2, 90), year=self._rng.randint(1950, 2020))
                      for s in self._rng.sample(_FILLER, self.filler)]
            return StepResult("\n".join([f"The label reads: {box} {self._codes[box]}", *filler]))
        reward = graded_reward(value, self._task.meta["boxes"], self._task.meta["codes"])
        return StepResult(f"Answer recorded: {value}", done=True, reward=reward, info={"answer": value})

    def expert(self, forget: float = 0.0) -> VaultExpert:
        return VaultExpert(forget)

    def corpus(self, n: int = 200) -> list[str]:
        """Text in this environment's vocabulary (for training a tokenizer that keeps names whole)."""
        rng = random.Random(f"vault-corpus-{self.world_seed}")
        out = [SYSTEM_PROMPT, *(t.description for t in TOOLS)]
        for _ in range(n):
            boxes = rng.sample(NAMES, 3)
            notes = pairs_text([(b, rng.choice(CODES)) for b in boxes])
            out.append(f"Report the codes of boxes {', '.join(boxes)}.")
            out.append(f"Notes: {notes}")
            out.append(f'{{"box": "{boxes[0]}"}} {{"text": "{notes}"}}')
        return out

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "world_seed": self.world_seed, "filler": self.filler}
