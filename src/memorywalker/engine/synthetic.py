"""Synthetic agent episodes with evictions, for tests and ``memorywalker bench engines``.

An episode is a system prompt, a task, then ``turns`` model calls. Each response calls a ``search``
tool (the last one answers) and its result follows. Before ``evictions`` of the calls the harness
compresses the history: it summarizes or truncates the oldest turns, or prunes the oldest tool output
to a placeholder; what it inserts is authored by ``harness`` (a compression artifact). ``retries``
calls are issued twice with the same context, so the tree branches right at the response start.

>>> from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
>>> traj = synthetic_trajectory(SyntheticSpec(turns=4, evictions=1, words=5), "ep-0")
>>> len(traj.calls), len(traj.evictions)
(4, 1)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from memorywalker.errors import InputError
from memorywalker.modelkit import bundled_corpus
from memorywalker.records import ToolSchema, Trajectory, TrajectoryBuilder


@dataclass
class SyntheticSpec:
    turns: int = 8  # model calls in the episode (retries included)
    evictions: int = 2  # compression events, each before a different call > 0
    words: int = 12  # words per response and per tool result
    retries: int = 0  # calls re-issued with the same context: a branch exactly at the response start
    seed: int = 0


def _vocab() -> list[str]:
    return sorted({w for p in bundled_corpus() for w in p.split() if w.isalpha() and len(w) > 2})


def _words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(max(1, n)))


def synthetic_trajectory(spec: SyntheticSpec, trajectory_id: str, *, prompt: tuple[str, str] | None = None,
                         first_words: str = "", reward: float | None = None) -> Trajectory:
    """One episode following ``spec``; ``prompt`` = (system, task) and ``first_words`` (a prefix of the
    first response) let rollouts of one GRPO group share a prefix beyond the prompt."""
    if spec.evictions >= spec.turns:
        raise InputError(f"evictions ({spec.evictions}) must be < turns ({spec.turns}): one per call > 0")
    rng = random.Random(f"{spec.seed}/{trajectory_id}")
    vocab = _vocab()
    b = TrajectoryBuilder(trajectory_id, tools=[ToolSchema(name="search", description="Search the web.")])
    system, task = prompt or ("You are a helpful research assistant.", "Question: " + _words(rng, vocab, 8))
    history = [b.message("system", system), b.message("user", task)]
    evict_before = set(rng.sample(range(1, spec.turns), spec.evictions))
    retry_at = set(rng.sample(sorted(set(range(spec.turns - 1)) - {t - 1 for t in evict_before}),
                              min(spec.retries, spec.turns - 1 - len(evict_before))))
    t = 0
    while t < spec.turns:
        if t in evict_before:
            _evict(b, rng, vocab, history, f"call-{t}")
        last = t == spec.turns - 1
        text = (first_words + " " if t == 0 and first_words else "") + _words(rng, vocab, spec.words)
        if last:
            resp = b.message("assistant", text)
        else:
            tc = {"id": f"tc{t}", "name": "search", "arguments": {"query": rng.choice(vocab)}}
            resp = b.message("assistant", text, tool_calls=[tc])
        b.call(list(history), resp, id=f"call-{t}")
        if t in retry_at:  # the same context again, a different response: a branch at the response start
            t += 1
            tc = {"id": f"tc{t}r", "name": "search", "arguments": {"query": rng.choice(vocab)}}
            resp = b.message("assistant", _words(rng, vocab, spec.words), tool_calls=[tc])
            b.call(list(history), resp, id=f"call-{t}")
        if not last and t < spec.turns - 1:
            tc_id = b.messages[-1].tool_calls[0].id
            obs = b.message("tool", "Search results: " + _words(rng, vocab, spec.words), tool_call_id=tc_id,
                            name="search")
            history += [resp, obs]
        t += 1
    b.reward = reward
    return b.build()


def _evict(b: TrajectoryBuilder, rng: random.Random, vocab: list[str], history: list[str], before: str) -> None:
    """Compress ``history`` in place (what follows system + task), recording the eviction."""
    msg = {m.id: m for m in b.messages}
    units: list[list[str]] = []  # an (assistant, tool result) pair or a lone message: removed whole
    i = 2
    while i < len(history):
        pair = msg[history[i]].role == "assistant" and i + 1 < len(history) and msg[history[i + 1]].role == "tool"
        units.append(history[i:i + 2] if pair else history[i:i + 1])
        i += len(units[-1])
    # Raw tool results the model has already seen (the newest one was never delivered: pruning it
    # before its first delivery would not change any context).
    raw = [i for i in range(2, len(history) - 1)
           if msg[history[i]].role == "tool" and not msg[history[i]].is_artifact]
    if len(units) >= 2:
        kind = rng.choice(["summarize", "truncate", "prune"] if raw else ["summarize", "truncate"])
    else:
        kind = "prune" if raw else "summarize"
    if kind == "prune":
        i = raw[0]  # the oldest raw tool result becomes a placeholder
        old = msg[history[i]]
        new = b.message(old.role, "[old tool output cleared]", author="harness", tool_call_id=old.tool_call_id,
                        name=old.name)
        b.eviction(before, "prune", [history[i]], [new])
        history[i] = new
        return
    k = rng.randint(1, max(1, len(units) - 1))
    removed = [mid for unit in units[:k] for mid in unit] or [history[1]]  # nothing yet: rewrite the task
    inserted = []
    if kind == "summarize":
        inserted = [b.message("user", "Summary of earlier steps: " + _words(rng, vocab, 6), author="harness")]
    b.eviction(before, kind, removed, inserted)
    start = history.index(removed[0])
    history[start:start + len(removed)] = inserted


def synthetic_group(spec: SyntheticSpec, group_id: str, size: int, *, shared_words: int = 3) -> list[Trajectory]:
    """``size`` rollouts of one task (a GRPO group): same system prompt and task, the first response
    starts with the same ``shared_words`` words, rewards differ. Their trees merge into one forest."""
    rng = random.Random(f"{spec.seed}/{group_id}")
    vocab = _vocab()
    prompt = ("You are a helpful research assistant.", "Question: " + _words(rng, vocab, 8))
    first = _words(rng, vocab, shared_words) if shared_words else ""
    return [
        synthetic_trajectory(spec, f"{group_id}-r{i}", prompt=prompt, first_words=first,
                             reward=float(rng.randint(0, 1)) if i else 1.0)
        for i in range(size)
    ]
