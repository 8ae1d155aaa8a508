"""Rollouts under compression: environments (the web-search world and suites, vault, a local document
corpus), harness compression policies, the policy backends by name (``make_policy``; the samplers
themselves are :mod:`memorywalker.samplers`), and the recording loop that writes trajectory schema v1."""

from memorywalker.rollout.backends import BACKENDS, make_policy
from memorywalker.rollout.compress import (
    COMPRESSORS,
    Compressor,
    apply_eviction,
    make_compressor,
    replay_contexts,
)
from memorywalker.rollout.corpus_env import CorpusEnv, CorpusExpert
from memorywalker.rollout.env import Environment, StepResult, exact_match, normalize_answer, split_of
from memorywalker.rollout.expert import ExpertPolicy
from memorywalker.rollout.faults import FAULT_KINDS, FaultConfig, FaultInjector
from memorywalker.rollout.harness import Episode, HarnessConfig, run_episode
from memorywalker.rollout.lockstep import EpisodeJob, run_episodes
from memorywalker.rollout.runner import RolloutSummary, next_tasks, plan, rollout, scan_existing
from memorywalker.rollout.suites import SUITES, make_task
from memorywalker.rollout.vault import VaultEnv, VaultExpert
from memorywalker.rollout.websearch import WebSearchEnv
from memorywalker.rollout.world import World

ENVIRONMENTS = {"websearch": WebSearchEnv, "vault": VaultEnv, "corpus": CorpusEnv}

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
