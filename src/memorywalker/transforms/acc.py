"""Agent Context Compilation (ACC): a trajectory compiled into one long-context QA record.

    memorywalker compile-acc expert.jsonl -o acc.jsonl --budget 1024 --seed 0

Agent SFT supervises an answer through a long chain of turns; the compiled record puts the evidence and the
answer in one context so the answer's gradient reaches every evidence token directly. For each trajectory:

* **gold evidence** — the full text of every page the agent opened (a successful ``open``);
* **distractors** — the pages its searches listed but it never opened;
* **packing** — gold pages always go in whole; distractors, in a seeded order, go in whole while they fit
  the token budget ``B`` (the user message: documents + question), the first that does not fit is cut to
  the remaining tokens; then all documents are shuffled with the seed. A trajectory whose gold evidence
  alone exceeds ``B`` is rejected — truncation never drops gold evidence;
* **target** — the expert's notes (its reasoning trace: one fact per line) and ``Answer: ...``, admitted only
  when the trajectory's answer was right (reward 1.0).
"""

from __future__ import annotations

import random
import re
from typing import Any

from tqdm import tqdm

from memorywalker.errors import InputError
from memorywalker.records import TrajectoryReader, write_trajectories
from memorywalker.records.derive import derive
from memorywalker.records.schema import Call, Message, Trajectory
from memorywalker.render.types import message_to_hf
from memorywalker.rollout import WebSearchEnv
from memorywalker.rollout.environments.base import exact_match
from memorywalker.rollout.environments.websearch.expert import NOTE_RE, RESULT_RE
from memorywalker.transforms.augment import render_tokens

TRANSFORM, VERSION = "compile-acc", "1"
SYSTEM = "Answer the question from the documents. Write the facts you use, one per line, then 'Answer: ...'."
MIN_CUT = 16  # a distractor cut below this many tokens is left out


def visited_and_candidates(traj: Trajectory) -> tuple[list[str], list[str]]:
    """(page ids opened successfully, in order; page ids listed by searches but never opened)."""
    results = {m.tool_call_id: m.content for m in traj.messages if m.role == "tool"}
    opened, listed = [], []
    for m in traj.messages:
        for tc in m.tool_calls:
            obs = results.get(tc.id, "")
            if tc.name == "open" and isinstance(tc.arguments, dict) and not obs.startswith("Error"):
                pid = str(tc.arguments.get("page", "")).strip().strip("[]")
                if pid not in opened:
                    opened.append(pid)
            elif tc.name == "search":
                listed += [pid for pid, _ in RESULT_RE.findall(obs) if pid not in listed]
    return opened, [p for p in listed if p not in opened]


def document(page) -> str:
    return f"Document [{page.id}]\n{page.text}"


def context_text(docs: list[str], question: str) -> str:
    """The user message of a compiled record: the documents, then the question."""
    return "\n\n".join(docs) + f"\n\nQuestion: {question}"


def pack(gold: list[str], distractors: list[str], question: str, tokenizer, budget: int,
         seed: int) -> list[str] | None:
    """The documents of the context (gold whole, distractors while they fit, the first that does not cut to
    the room left), in a seeded shuffled order; ``None`` when gold + question alone exceed ``budget``.
    The budget is checked on the assembled text (token merges across joins included)."""
    def n(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    if n(context_text(gold, question)) > budget:
        return None
    rng = random.Random(f"acc-{seed}")
    pool = list(distractors)
    rng.shuffle(pool)
    added: list[str] = []
    used = n(context_text(gold, question))
    for d in pool:
        cost = n(d) + 2
        if used + cost <= budget:
            added.append(d)
            used += cost
            continue
        room = budget - used - 2
        if room >= MIN_CUT:
            added.append(tokenizer.decode(tokenizer(d, add_special_tokens=False)["input_ids"][:room]))
        break
    order = rng.random()
    while True:
        docs = gold + added
        random.Random(order).shuffle(docs)
        if n(context_text(docs, question)) <= budget:
            return docs
        cut = added.pop()  # an estimate was off by a merge: shorten (then drop) the last distractor
        ids = tokenizer(cut, add_special_tokens=False)["input_ids"]
        if len(ids) > MIN_CUT + 8:
            added.append(tokenizer.decode(ids[: len(ids) - 8]))


def reasoning_trace(traj: Trajectory) -> str:
    """The notes of the last assistant turn that wrote any (the expert restates all its notes each turn)."""
    for m in reversed(traj.messages):
        if m.role == "assistant" and NOTE_RE.search(m.content):
            return "\n".join(f"- {e} | {a}: {v}" for e, a, v in NOTE_RE.findall(m.content))
    return ""


def compile_record(parent: Trajectory, world, tokenizer, *, budget: int, seed: int = 0,
                   index: int = 0) -> tuple[Trajectory | None, str]:
    """``(compiled record, "")`` or ``(None, reason)`` (a wrong answer, or gold evidence over budget)."""
    answer = (parent.outcome or {}).get("answer")
    if parent.reward != 1.0 or answer is None or parent.task is None:
        return None, "answer not verified right"
    if exact_match(str(answer), parent.task.answer or "") != 1.0:
        return None, "answer not verified right"
    opened, listed = visited_and_candidates(parent)
    gold = [document(world.pages[p]) for p in opened if p in world.pages]
    if not gold:
        return None, "no page opened"
    distractors = [document(world.pages[p]) for p in listed if p in world.pages]
    question = parent.task.meta.get("question", "")
    packed = pack(gold, distractors, question, tokenizer, budget, seed)
    if packed is None:
        return None, f"gold evidence exceeds the budget {budget}"
    docs = packed
    order = [re.match(r"Document \[([^\]]+)\]", d).group(1) if d.startswith("Document [") else "?" for d in docs]
    user = context_text(docs, question)
    target = f"{reasoning_trace(parent)}\nAnswer: {answer}".lstrip()
    messages = [Message(id="m0", role="system", content=SYSTEM, author="system"),
                Message(id="m1", role="user", content=user, author="user"),
                Message(id="m2", role="assistant", content=target, author="model")]
    calls = [Call(id="c0", context=["m0", "m1"], response="m2", tools=[], purpose="act")]
    meta = {"acc": {"budget": budget, "seed": seed, "order": order, "gold": opened,
                    "distractors": [p for p in order if p not in opened]}}
    return derive(parent, TRANSFORM, VERSION, index=index, messages=messages, calls=calls, evictions=[], tools=[],
                  meta=meta), ""


def world_of(traj: Trajectory):
    cfg = {k: v for k, v in (traj.meta.get("env") or {}).items() if k != "name"}
    if (traj.meta.get("env") or {}).get("name") != "websearch":
        raise InputError(f"{traj.id}: compile-acc needs a websearch episode (its pages), not {traj.meta.get('env')}")
    return WebSearchEnv(**cfg).world


def compile_file(src, out, tokenizer, *, budget: int, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Compile every record of ``src`` into ``out``; the counts, rejection reasons and token expansion."""
    worlds: dict[str, Any] = {}
    out_recs, reasons, tp, tc = [], {}, 0, 0
    parents = list(TrajectoryReader(src))
    for p in tqdm(parents, desc="compile-acc", unit="rec", disable=not progress):
        key = repr(sorted((p.meta.get("env") or {}).items()))
        world = worlds.setdefault(key, world_of(p))
        rec, why = compile_record(p, world, tokenizer, budget=budget, seed=seed)
        if rec is None:
            reasons[why] = reasons.get(why, 0) + 1
            continue
        out_recs.append(rec)
        tp += render_tokens(p, tokenizer)
        tc += render_tokens(rec, tokenizer)
    write_trajectories(out, out_recs)
    return {"parents": len(parents), "written": len(out_recs), "rejected": reasons,
            "token_expansion": tc / tp if tp else None}


def qa_answer(text: str) -> str:
    """The answer of a compiled-QA response: what follows the last ``Answer:``.

    >>> qa_answer("- Ken | founded: 1203\\nAnswer: 1203")
    '1203'
    """
    return text.rsplit("Answer:", 1)[-1].strip() if "Answer:" in text else text.strip()


def qa_accuracy(model, tokenizer, records: list[Trajectory], *, max_new_tokens: int = 48) -> dict[str, float]:
    """Per held-out compiled record (task id): 1.0 when greedy decoding's answer matches the task's."""
    import torch  # lazy: only qa_accuracy needs torch (compile-acc runs without it)

    out = {}
    for r in records:
        prompt = tokenizer.apply_chat_template([message_to_hf(m) for m in r.messages[:2]], tokenize=False,
                                               add_generation_prompt=True)
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        text = tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        out[r.task.id] = exact_match(qa_answer(text), r.task.answer or "")
    return out
