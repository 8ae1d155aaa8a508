"""Rollouts under compression, in three parts:

* :mod:`.environments` — the environments (``websearch``, ``vault``, ``corpus``), each with its scripted
  expert beside it;
* :mod:`.compressors` — the simulated harnesses' context compressors (``claude-code``, ``opencode``, ...);
* :mod:`.episodes` — the episode loop that records trajectory schema v1, lockstep batching, the runner,
  fault injection, and the samplers by name (``make_policy``; the samplers themselves are
  :mod:`memorywalker.samplers`).

Every public name is importable from here.
"""

from memorywalker.rollout.compressors import (
    COMPRESSORS,
    Compressor,
    apply_eviction,
    make_compressor,
    replay_contexts,
)
from memorywalker.rollout.environments import ENVIRONMENTS
from memorywalker.rollout.environments.base import (
    Environment,
    StepResult,
    exact_match,
    normalize_answer,
    split_of,
)
from memorywalker.rollout.environments.corpus.env import CorpusEnv
from memorywalker.rollout.environments.corpus.expert import CorpusExpert
from memorywalker.rollout.environments.vault.env import VaultEnv
from memorywalker.rollout.environments.vault.expert import VaultExpert
from memorywalker.rollout.environments.websearch.env import WebSearchEnv
from memorywalker.rollout.environments.websearch.expert import ExpertPolicy
from memorywalker.rollout.environments.websearch.suites import SUITES, make_task
from memorywalker.rollout.environments.websearch.world import World
from memorywalker.rollout.episodes.backends import BACKENDS, make_policy
from memorywalker.rollout.episodes.faults import FAULT_KINDS, FaultConfig, FaultInjector
from memorywalker.rollout.episodes.harness import Episode, HarnessConfig, run_episode
from memorywalker.rollout.episodes.lockstep import EpisodeJob, run_episodes
from memorywalker.rollout.episodes.runner import RolloutSummary, next_tasks, plan, rollout, scan_existing

__all__ = [
    "BACKENDS",
    "COMPRESSORS",
    "ENVIRONMENTS",
    "FAULT_KINDS",
    "SUITES",
    "Compressor",
    "CorpusEnv",
    "CorpusExpert",
    "Environment",
    "Episode",
    "EpisodeJob",
    "ExpertPolicy",
    "FaultConfig",
    "FaultInjector",
    "HarnessConfig",
    "RolloutSummary",
    "StepResult",
    "VaultEnv",
    "VaultExpert",
    "WebSearchEnv",
    "World",
    "apply_eviction",
    "exact_match",
    "make_compressor",
    "make_policy",
    "make_task",
    "next_tasks",
    "normalize_answer",
    "plan",
    "replay_contexts",
    "rollout",
    "run_episode",
    "run_episodes",
    "scan_existing",
    "split_of",
]
