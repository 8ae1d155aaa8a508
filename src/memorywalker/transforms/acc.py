"""Agent Context Compilation (ACC): a trajectory compiled into one long-context QA record.

    memorywalker compile-acc episodes.jsonl -o acc.jsonl --budget 1024 --seed 0

Agent SFT supervises an answer through a long chain of turns; the compiled record puts the evidence and the
answer in one context so the answer's gradient reaches every evidence token directly. For each trajectory
of an environment with documents (``websearch`` pages, ``corpus`` documents, ``vault`` boxes):

* **gold evidence** — the full text of every document the agent opened (an ``open`` whose result served
  it): the page or the corpus document from the environment, the box's observation as recorded;
* **distractors** — the documents its searches listed but it never opened (``websearch``, ``corpus``);
  in the ``vault``, the observations of the boxes its task does not name (the task's world replayed);
* **packing** — gold documents always go in whole; distractors, in a seeded order, go in whole while they
  fit the token budget ``B`` (the user message: documents + question), the first that does not fit is cut
  to the remaining tokens; then all documents are shuffled with the seed. A trajectory whose gold evidence
  alone exceeds ``B`` is rejected — truncation never drops gold evidence;
* **target** — the agent's notes where they are facts (``websearch``: one per line) and ``Answer: ...``,
  admitted only when the environment verified the answer (reward 1.0).
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
from memorywalker.render.toolcalls import call_arguments
from memorywalker.render.types import message_to_hf
from memorywalker.rollout.environments.base import exact_match
from memorywalker.rollout.environments.corpus.documents import FAILED
from memorywalker.rollout.environments.corpus.env import RESULT_RE, CorpusEnv
from memorywalker.rollout.environments.vault.env import NAMES, VaultEnv
from memorywalker.rollout.environments.websearch.env import WebSearchEnv
from memorywalker.rollout.environments.websearch.expert import NOTE_RE
from memorywalker.transforms.augment import render_tokens

TRANSFORM, VERSION = "compile-acc", "2"
SYSTEM = "Answer the question from the documents. Write the facts you use, one per line, then 'Answer: ...'."
MIN_CUT = 16  # a distractor cut below this many tokens is left out
ENVS = ("websearch", "corpus", "vault")
OPEN_ARG = {"websearch": "page", "corpus": "docid", "vault": "box"}  # the argument of ``open`` naming the document


def visited_and_candidates(traj: Trajectory, env_name: str = "websearch") -> tuple[list[str], list[str]]:
    """(document ids opened successfully, in order; ids listed by searches but never opened)."""
    results = {m.tool_call_id: m for m in traj.messages if m.role == "tool"}
    opened, listed = [], []
    for m in traj.messages:
        for tc in m.tool_calls:
            obs = results.get(tc.id)
            if obs is None or obs.content.startswith(FAILED) or obs.meta.get("fault"):  # it served nothing
                continue
            if tc.name == "open" and (args := call_arguments(tc.arguments)) is not None:
                doc = str(args.get(OPEN_ARG[env_name], "")).strip().strip("[]")
                if doc and doc not in opened:
                    opened.append(doc)
            elif tc.name == "search":
                # "N. [id] ..." result lines, the same in web search's and the corpus's results
                listed += [d for d in RESULT_RE.findall(obs.content) if d not in listed]
    return opened, [d for d in listed if d not in opened]


def documents(traj: Trajectory, env) -> tuple[list[str], list[str]]:
    """``traj``'s (gold, distractor) documents in ``env`` (the environment it ran in), each as
    ``Document [id]`` and its text."""
    opened, listed = visited_and_candidates(traj, env.name)
    if env.name != "vault":
        def text(d: str) -> str | None:
            doc = env.world.pages.get(d) if env.name == "websearch" else env.corpus.get(d)
            return None if doc is None else doc.text

        return ([document(d, text(d)) for d in opened if text(d) is not None],
                [document(d, text(d)) for d in listed if text(d) is not None])
    # vault: a box's observation as the episode recorded it; the other boxes' from the task's world replayed
    opened = list(dict.fromkeys(b.lower() for b in opened))  # the vault reads box names case-blind
    seen = {tc.id: call_arguments(tc.arguments) or {} for m in traj.messages for tc in m.tool_calls if tc.name == "open"}
    observed = {}
    for m in traj.messages:
        if m.role == "tool" and m.tool_call_id in seen and not m.content.startswith(FAILED):
            observed.setdefault(str(seen[m.tool_call_id].get("box", "")).strip().lower(), m.content)
    env.reset(traj.task)
    others = [b for b in NAMES if b not in traj.task.meta["boxes"] and b not in opened]
    return ([document(b, observed[b]) for b in opened if b in observed],
            [document(b, env.step("open", {"box": b}).observation) for b in others])


def document(doc_id: str, text: str) -> str:
    return f"Document [{doc_id}]\n{text}"


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
    """The notes of the last assistant turn that wrote any (the web-search expert restates all its notes each
    turn, one fact per line)."""
    for m in reversed(traj.messages):
        if m.role == "assistant" and NOTE_RE.search(m.content):
            return "\n".join(f"- {e} | {a}: {v}" for e, a, v in NOTE_RE.findall(m.content))
    return ""


def compile_record(parent: Trajectory, env, tokenizer, *, budget: int, seed: int = 0,
                   index: int = 0) -> tuple[Trajectory | None, str]:
    """``(compiled record, "")`` or ``(None, reason)`` (an answer not verified right, no document opened, or
    gold evidence over budget). ``env``: the environment ``parent`` ran in (:func:`env_of`)."""
    answer = (parent.outcome or {}).get("answer")
    if parent.reward != 1.0 or answer is None or parent.task is None:
        return None, "answer not verified right"
    if env.name == "websearch" and exact_match(str(answer), parent.task.answer or "") != 1.0:
        return None, "answer not verified right"
    gold, distractors = documents(parent, env)
    if not gold:
        return None, "no document opened"
    question = parent.task.meta.get("question", "")
    docs = pack(gold, distractors, question, tokenizer, budget, seed)
    if docs is None:
        return None, f"gold evidence exceeds the budget {budget}"
    order = [re.match(r"Document \[([^\]]+)\]", d).group(1) if d.startswith("Document [") else "?" for d in docs]
    opened = [re.match(r"Document \[([^\]]+)\]", d).group(1) for d in gold]
    user = context_text(docs, question)
    trace = reasoning_trace(parent) if env.name == "websearch" else ""  # the others' notes are no such facts
    target = f"{trace}\nAnswer: {answer}".lstrip()
    messages = [Message(id="m0", role="system", content=SYSTEM, author="system"),
                Message(id="m1", role="user", content=user, author="user"),
                Message(id="m2", role="assistant", content=target, author="model")]
    calls = [Call(id="c0", context=["m0", "m1"], response="m2", tools=[], purpose="act")]
    meta = {"acc": {"budget": budget, "seed": seed, "order": order, "gold": opened,
                    "distractors": [p for p in order if p not in opened]}}
    return derive(parent, TRANSFORM, VERSION, index=index, messages=messages, calls=calls, evictions=[], tools=[],
                  meta=meta), ""


def env_of(traj: Trajectory):
    """The environment ``traj`` ran in, rebuilt from its recorded configuration (``meta.env``)."""
    recorded = traj.meta.get("env") or {}
    name, cfg = recorded.get("name"), {k: v for k, v in recorded.items() if k != "name"}
    if name not in ENVS:
        raise InputError(f"compile-acc needs an episode of an environment with documents ({', '.join(ENVS)}), "
                         f"not {name!r}")
    if name == "corpus":
        corpus, queries = cfg.pop("corpus"), cfg.pop("queries")
        return CorpusEnv(corpus, queries, **cfg)
    return {"websearch": WebSearchEnv, "vault": VaultEnv}[name](**cfg)


def compile_file(src, out, tokenizer, *, budget: int, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Compile every record of ``src`` into ``out``; the counts, rejection reasons and token expansion. A
    record whose environment has no documents, or cannot be rebuilt (a corpus file changed since), is set
    aside with that reason; the others are compiled."""
    envs: dict[str, Any] = {}  # recorded configuration -> its environment, or why there is none
    out_recs, reasons, tp, tc = [], {}, 0, 0
    parents = list(TrajectoryReader(src))
    for p in tqdm(parents, desc="compile-acc", unit="rec", disable=not progress):
        key = repr(sorted((p.meta.get("env") or {}).items()))
        if key not in envs:
            try:
                envs[key] = env_of(p)
            except InputError as err:
                envs[key] = str(err)
        env = envs[key]
        rec, why = (None, env) if isinstance(env, str) else compile_record(p, env, tokenizer, budget=budget, seed=seed)
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
