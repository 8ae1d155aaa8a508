"""Many episodes to one append-only JSONL file, resumable after a kill.

The episodes of a run are a fixed plan: task ``index`` of the suite (those in ``split``, if given)
times ``samples`` rollouts each, every episode with its own seed derived from the run seed, the task
and the sample number. Re-running the same command reads the file, drops a truncated final line (a
kill mid-write), skips the episodes already written and appends the rest, so an interrupted and resumed
run writes byte-for-byte what an uninterrupted one writes.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memorywalker.errors import InputError
from memorywalker.records.io import TrajectoryWriter
from memorywalker.records.schema import Task, Trajectory
from memorywalker.rollout.environments.base import Environment
from memorywalker.rollout.episodes.harness import HarnessConfig, call_seed, run_episode
from memorywalker.rollout.episodes.lockstep import EpisodeJob, run_episodes
from memorywalker.samplers.base import Policy


def next_tasks(env: Environment, suite: str, n: int, *, split: str | None = None,
               start: int = 0) -> tuple[list[Task], int]:
    """The next ``n`` tasks of ``suite`` (in ``split`` if given) from suite index ``start``, and the index
    after the last one taken (where the next call starts)."""
    tasks: list[Task] = []
    index = start
    while len(tasks) < n:
        task = env.task(suite, index)
        index += 1
        if split is not None and task.split != split:
            # give up: a split a third of the tasks hold is met every few indices, one none holds never
            if index - start > 1000 * (n + 1):
                raise InputError(f"no tasks of split {split!r} in suite {suite!r} (looked at {index - start} "
                                 f"tasks from index {start})")
            continue
        tasks.append(task)
    return tasks, index


def plan(env: Environment, suite: str, n: int, *, seed: int, harness: str, split: str | None = None,
         samples: int = 1, start: int = 0) -> list[EpisodeJob]:
    """The first ``n`` tasks of ``suite`` (in ``split`` if given) x ``samples`` rollouts each."""
    tasks, _ = next_tasks(env, suite, n, split=split, start=start)
    return [EpisodeJob(task, call_seed(seed, task.id, j), f"{task.id}-{harness}-s{seed}-r{j}", {"sample": j})
            for task in tasks for j in range(samples)]


def scan_existing(path: str | os.PathLike) -> tuple[list[str], int]:
    """Ids of the complete records of ``path`` and the byte length they span.

    A final line without a newline or that does not parse is a write cut off by a kill: it is not
    counted (the caller truncates the file to the returned length). A bad line elsewhere is an error.
    """
    ids: list[str] = []
    good = 0
    p = Path(path)
    if not p.exists():
        return ids, 0
    with open(p, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        try:
            if end < 0:
                raise ValueError("no newline")
            ids.append(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError) as e:
            if end < 0 or data.find(b"\n", end + 1) < 0 and not data[end + 1:].strip():
                break  # the last line: a cut-off write
            raise InputError(f"{path}: byte {pos}: a corrupt record that is not the last line ({e})") from None
        pos = end + 1
        good = pos
    return ids, good


@dataclass
class RolloutSummary:
    written: int = 0
    skipped: int = 0
    correct: int = 0
    evictions: Counter = field(default_factory=Counter)  # number of evictions -> episodes
    kinds: Counter = field(default_factory=Counter)

    def add(self, traj: Trajectory) -> None:
        self.written += 1
        self.correct += int(traj.reward == 1.0)
        self.evictions[len(traj.evictions)] += 1
        self.kinds.update(ev.kind for ev in traj.evictions)

    @property
    def success(self) -> float:
        return self.correct / self.written if self.written else 0.0


def iter_rollouts(env: Environment, episodes: list[EpisodeJob], policy: Policy, tokenizer,
                  config: HarnessConfig, *, run_seed: int, batch: int = 1) -> Iterator[Trajectory]:
    """The episodes' trajectories in plan order. With ``batch > 1`` (a policy with ``generate_batch``)
    ``batch`` episodes at a time run in lockstep (:func:`~memorywalker.rollout.episodes.lockstep.run_episodes`),
    their calls batched; a failure in a group raises after the group ends, and none of it is yielded."""
    jobs = [e.with_meta({"run_seed": run_seed, "sample": e.sample}) for e in episodes]
    if batch <= 1 or not hasattr(policy, "generate_batch"):
        for e in jobs:
            yield run_episode(env, e.task, policy, tokenizer, config, seed=e.seed, episode_id=e.episode_id,
                              meta=e.meta)
        return
    for i in range(0, len(jobs), batch):
        yield from run_episodes(env, jobs[i:i + batch], policy, tokenizer, config)


def recorded_setup(path: str | os.PathLike) -> dict | None:
    """The ``env``, ``harness`` and ``policy`` configuration recorded in the first episode of ``path``."""
    with open(path, "rb") as f:
        first = f.readline()
    try:
        meta = json.loads(first).get("meta") or {}
    except ValueError:
        return None
    return {k: meta.get(k) for k in ("env", "harness", "policy")}


def setup_changes(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """``"harness.budget: 2048 -> 1024"`` for every leaf that differs.

    >>> setup_changes({"env": {"world_seed": 0}}, {"env": {"world_seed": 1}})
    ['env.world_seed: 0 -> 1']
    """
    out = []
    for key in sorted(set(recorded) | set(current)):
        a, b = recorded.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += setup_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {json.dumps(a)} -> {json.dumps(b)}")
    return out


def rollout(env: Environment, policy: Policy, tokenizer, config: HarnessConfig, *, suite: str, n: int,
            seed: int = 0, split: str | None = None, samples: int = 1, out: str | os.PathLike | None = None,
            progress: bool = False, override_config: bool = False, batch: int = 1
            ) -> tuple[list[Trajectory] | None, RolloutSummary]:
    """Roll out ``n`` tasks of ``suite`` x ``samples``; write them to ``out`` (resuming) or return them.

    ``batch > 1`` runs that many episodes at a time in lockstep (a policy with ``generate_batch``: hf,
    vllm); each episode is still written whole, in plan order, once its group has finished.

    Resuming into ``out`` requires its episodes to have been run with the same environment, harness and
    policy configuration (``override_config`` appends anyway). The file is created with its first
    episode: a run that fails before one is complete leaves no empty file behind.

    Returns ``(trajectories or None when writing to a file, summary of the episodes run now)``.
    """
    episodes = plan(env, suite, n, seed=seed, harness=config.name, split=split, samples=samples)
    summary = RolloutSummary()
    done: set[str] = set()
    if out is not None:
        ids, good = scan_existing(out)
        planned = {e.episode_id for e in episodes}
        foreign = [i for i in ids if i not in planned]
        if foreign:
            raise InputError(f"{out} holds episodes of a different run (e.g. {foreign[0]!r}); use another file")
        recorded = recorded_setup(out) if ids else None
        if recorded is not None and not override_config:
            current = {"env": env.config(), "harness": asdict(config), "policy": policy.config()}
            changed = setup_changes(recorded, json.loads(json.dumps(current)))  # tuples as JSON lists
            if changed:
                raise InputError(f"{out}: its episodes were run with a different configuration "
                                 f"({'; '.join(changed)}); pass --override-config to append anyway, "
                                 "or use another file")
        if Path(out).exists() and Path(out).stat().st_size != good:
            with open(out, "r+b") as f:
                f.truncate(good)
        done = set(ids)
        summary.skipped = len(done)
    todo = [e for e in episodes if e.episode_id not in done]
    bar = None
    if progress:
        from tqdm import tqdm  # lazy: tqdm (~30 ms) off the CLI's start path

        bar = tqdm(total=len(episodes), initial=len(done), desc=f"{suite}/{config.name}", unit="ep")
    trajs: list[Trajectory] = []
    writer = None  # opened with the first finished episode: a failed run leaves no empty file
    try:
        for traj in iter_rollouts(env, todo, policy, tokenizer, config, run_seed=seed, batch=batch):
            summary.add(traj)
            if out is not None:
                writer = writer or TrajectoryWriter(out, mode="a")
                writer.write(traj)
            else:
                trajs.append(traj)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(success=f"{summary.success:.2f}")
    finally:
        if writer is not None:
            writer.close()
        if bar is not None:
            bar.close()
    return (None if out is not None else trajs), summary
