"""DAgger recipe: label the states the learner visits, keep the verified labels, retrain, repeat.

    memorywalker dagger --model kit --suite lookup --rounds 2 --n 8 --compressor claude-code -o runs/dagger

Round ``k`` (Ross et al. 2011, https://arxiv.org/abs/1011.0686):

1. Roll out ``n`` training tasks under a compressing harness with a mixed policy: at every act call an
   authorized labeler (the scripted expert, or any policy backend) proposes its action — the label — and
   the learner proposes its own; the harness executes the labeler's with probability ``beta_k`` and the
   learner's otherwise (``betas``, default: the labeler only in round 1, the learner only after).
2. Verify each label: execute it in a separate copy of the environment and let the labeler continue from
   there (no compression); the label is admitted only if that continuation earns reward 1.
3. Each admitted label becomes a derived record (``lineage.transform = "dagger"``) of the rolled-out
   episode: the call's delivered context, the label as the response. The aggregated dataset grows.
4. Retrain the learner on the aggregated dataset (the SFT recipe, from the base model) and evaluate it
   on held-out tasks (closed-loop, greedy, the same tasks and seeds each round).

Reported per round: labels proposed/admitted, learner-state labels (states whose context holds a learner
response), learner-state disagreement (learner proposal != label at states the learner's own actions
reached), held-out reward with a paired interval against the previous round, and the token expansion
ratio (tokens of derived records / tokens of the episodes they came from).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memorywalker.errors import InputError
from memorywalker.eval.evaluate import EvalConfig, load_candidate, make_env, run_suite
from memorywalker.metrics.closed_loop import per_task_acceptance
from memorywalker.metrics.stats import paired_bootstrap, paired_differences
from memorywalker.records.io import write_trajectories
from memorywalker.records.schema import Trajectory
from memorywalker.render import Renderer
from memorywalker.rollout import HarnessConfig, make_policy, plan, run_episode
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.samplers.hf import HFPolicy
from memorywalker.transforms.dagger import MixedPolicy, label_records
from memorywalker.transforms.distill import TransformStats, record_tokens


@dataclass
class DaggerConfig:
    """``memorywalker dagger``: every field lands in the report."""

    env: str = "websearch"  # environment (memorywalker.rollout.ENVIRONMENTS): websearch | vault
    suite: str = "lookup"  # the environment's suite rolled out and evaluated
    rounds: int = 2  # DAgger rounds (each: roll out, label, verify, retrain, evaluate)
    n: int = 8  # training tasks rolled out per round
    betas: tuple[float, ...] = (1.0, 0.0)  # beta_k: P(execute the labeler's action) in round k; last repeats
    labeler: str = "expert"  # expert | hf:DIR | openai:URL (rollout.make_policy)
    expert_forget: float = 0.0  # vault: the share of episodes whose expert summaries keep only the newest label
    compressor: str = "claude-code"  # compression policy of the rollouts (was `harness`)
    budget: int = 1024  # context budget in prompt tokens the compressor keeps to
    max_steps: int = 8  # act calls per episode (rollouts, verification and evaluation)
    max_context: int = HarnessConfig.max_context  # hard context window in tokens
    temperature: float = 1.0  # learner sampling temperature in rollouts (evaluation is greedy)
    max_new_tokens: int = 96  # learner response length limit
    world_seed: int = 0
    world_size: dict[str, int] = field(default_factory=dict)  # WebSearchEnv world size (small = easy)
    eval_n: int = 8  # held-out tasks evaluated after every round (and before round 1)
    eval_split: str = "test"
    sft_steps: int = 20  # SFT steps per retraining (from the base model, on the aggregated dataset)
    sft_lr: float = 3e-3
    sft_batch_size: int = 4
    sft_warmup_steps: int = 0
    method: str = "radix"  # SFT conditioning method
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self):
        if self.expert_forget and (self.labeler != "expert" or self.env != "vault"):
            raise InputError(f"expert_forget={self.expert_forget}: only the vault's expert forgets "
                             "(labeler expert, env vault)")

    def beta(self, k: int) -> float:
        """beta_k for round ``k`` (1-based)."""
        return self.betas[min(k, len(self.betas)) - 1]


@dataclass
class RoundReport:
    round: int
    beta: float
    episodes: int
    episode_reward: float  # reward of the mixed-policy episodes
    states: int  # act calls labeled
    admitted: int  # labels that passed verification
    learner_states: int  # admitted labels at states whose context holds a learner response
    learner_state_disagreement: float | None  # learner proposal != label, over learner-reached states
    dataset: int  # aggregated records after this round
    tokens: dict[str, Any]  # token expansion of this round's labels
    sft_loss: float | None
    held_out_reward: float  # after retraining
    paired_vs_previous: dict[str, Any]  # per-task difference vs the previous model, bootstrap interval


def _eval_config(cfg: DaggerConfig) -> EvalConfig:
    return EvalConfig(suites=(cfg.suite,), env=cfg.env, compressor=cfg.compressor, budget=cfg.budget, max_steps=cfg.max_steps,
                      max_context=cfg.max_context, n=cfg.eval_n, seed=cfg.seed, split=cfg.eval_split,
                      world_seed=cfg.world_seed, world_size=cfg.world_size, temperature=0.0,
                      max_new_tokens=cfg.max_new_tokens, device=cfg.device)


def _labeler(cfg: DaggerConfig, env):
    if cfg.expert_forget:  # VaultExpert: careless summaries in that share of its episodes
        return env.expert(cfg.expert_forget)
    return make_policy(cfg.labeler, env=env)


def _eval_rows(model_dir: str, cfg: DaggerConfig, env, harness, out: Path, label: str, tokenizer):
    ecfg = _eval_config(cfg)
    cand = load_candidate(model_dir, label, ecfg, tokenizer=tokenizer)
    return run_suite(env, cand, harness, ecfg, cfg.suite, out / f"eval-{label}.jsonl")


def run_dagger(cfg: DaggerConfig, model_dir: str, out: str | Path, *, tokenizer_dir: str | None = None,
               progress: bool = False) -> dict[str, Any]:
    """Run ``cfg.rounds`` DAgger rounds from the model at ``model_dir``; write every round's rollouts,
    labels (``labels-k.jsonl``), SFT run and evaluation under ``out``; return (and write) the report."""
    from transformers import AutoTokenizer  # lazy: ~1 s; cli dagger imports this module before its checks

    from memorywalker.recipes.sft import SFTConfig, train  # lazy: pulls torch (as above)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    renderer = Renderer(tok)
    env, verify_env = make_env(_eval_config(cfg)), make_env(_eval_config(cfg))
    harness = HarnessConfig.of(cfg)
    rows_prev = _eval_rows(model_dir, cfg, env, harness, out, "round-0", tok)
    base_reward = sum(r["accepted"] for r in rows_prev) / len(rows_prev)
    report: dict[str, Any] = {"config": asdict(cfg), "model": model_dir, "held_out_reward_before": base_reward,
                              "rounds": []}
    dataset: list[Trajectory] = []
    learner_dir = model_dir
    bar = None
    if progress:
        bar = tqdm(total=cfg.rounds * cfg.n, desc="dagger", unit="ep")
    for k in range(1, cfg.rounds + 1):
        # --- roll out with the mixed policy, label, verify ------------------------------------------------
        beta = cfg.beta(k)
        learner = HFPolicy(learner_dir, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                           device=cfg.device, tokenizer=tok)
        mixed = MixedPolicy(learner, _labeler(cfg, env), beta, tok, verify_env, max_steps=cfg.max_steps)
        episodes = plan(env, cfg.suite, cfg.n, seed=call_seed(cfg.seed, "dagger-round", k), harness=harness.name,
                        split="train")
        trajs, labels, stats = [], [], TransformStats()
        states = disagree = learner_reached = 0
        for e in episodes:
            traj = run_episode(env, e.task, mixed, tok, harness, seed=e.seed, episode_id=f"{e.episode_id}-dagger{k}",
                               meta={"run_seed": cfg.seed, "dagger_round": k})
            trajs.append(traj)
            executed = [lab["executed"] for lab in mixed.labels]
            for j, lab in enumerate(mixed.labels):
                states += 1
                if "learner" in executed[:j]:  # a state the learner's own actions reached
                    learner_reached += 1
                    disagree += not lab["agree"]
            recs = label_records(traj, mixed.labels, renderer, round_k=k, beta=beta)
            labels += recs
            stats.records_in += 1
            stats.tokens_in += record_tokens(traj)
            stats.records_out += len(recs)
            stats.tokens_out += sum(record_tokens(r) for r in recs)
            if bar is not None:
                bar.update(1)
        write_trajectories(out / f"rollouts-{k}.jsonl", trajs)
        write_trajectories(out / f"labels-{k}.jsonl", labels)
        dataset += labels

        # --- retrain on the aggregated dataset, evaluate ---------------------------------------------------
        sft_loss = None
        if dataset:
            result = train(SFTConfig(model=model_dir, tokenizer=tokenizer_dir, data=None, run_dir=str(out / f"sft-{k}"),
                                     steps=cfg.sft_steps, lr=cfg.sft_lr, batch_size=min(cfg.sft_batch_size, len(dataset)),
                                     warmup_steps=cfg.sft_warmup_steps,
                                     method=cfg.method, seed=cfg.seed, device=cfg.device,
                                     save_every=cfg.sft_steps),
                           trajectories=dataset, progress=False)
            learner_dir = str(result.final_dir)
            sft_loss = result.metrics[-1]["loss"]
        rows = _eval_rows(learner_dir, cfg, env, harness, out, f"round-{k}", tok)
        diffs = paired_differences(per_task_acceptance(rows), per_task_acceptance(rows_prev))
        mean, lo, hi = paired_bootstrap(diffs, seed=cfg.seed)
        admitted_learner = sum(r.meta["dagger"]["learner_state"] for r in labels)
        report["rounds"].append(asdict(RoundReport(
            round=k, beta=beta, episodes=len(trajs), episode_reward=sum(t.reward or 0 for t in trajs) / len(trajs),
            states=states, admitted=len(labels), learner_states=admitted_learner,
            learner_state_disagreement=disagree / learner_reached if learner_reached else None,
            dataset=len(dataset), tokens=stats.as_dict(), sft_loss=sft_loss,
            held_out_reward=sum(r["accepted"] for r in rows) / len(rows),
            paired_vs_previous={"tasks": len(diffs), "difference": mean, "ci95": [lo, hi]})))
        rows_prev = rows
    if bar is not None:
        bar.close()
    report["held_out_reward_after"] = report["rounds"][-1]["held_out_reward"]
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report
