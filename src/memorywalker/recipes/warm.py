"""The demo's warm start (stage 3 of :mod:`memorywalker.recipes.demo`) and the copy check that verifies it.

One checkpoint for every method: SFT on uncompressed expert episodes (one path each, so every method
would train the same targets on the same contexts) and on the summarization calls of ``claude-code``
expert episodes, one call per record. :func:`copy_check` measures the skill the ``vault`` task needs
(every name and code an agent writes is a copy of one in its context) where the task needs it.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from memorywalker.metrics.report import warm_copies
from memorywalker.records import derive
from memorywalker.render import Renderer
from memorywalker.rollout import HarnessConfig, rollout
from memorywalker.rollout.environments.vault.env import CODES, NAMES

if TYPE_CHECKING:
    from memorywalker.recipes.demo import DemoConfig


def warm_start(cfg: DemoConfig, out: Path, model_dir, tokenizer, env, *, progress: bool = True, log=print):
    """Stage 3: ``warm_steps`` of SFT of ``model_dir`` on uncompressed expert episodes (one path each, so
    every method trains the same) and on single summarization calls of ``claude-code`` episodes.

    Every ``warm_check_every`` steps :func:`copy_check` scores the copies the expert writes in held-out
    episodes, on two sets: the box names and codes of the act calls of uncompressed episodes (target
    ``warm_copy_target``), and the codes of the summarization calls of compacted ones, where the label to
    copy sits before the long summarize instruction (target ``warm_summary_target``; their box names are
    left out, since whether a careless summary names the older box first is the expert's coin flip, not
    something the context determines). The last check is the verification: below either target, the log
    and the table say the warm start did not learn to copy.

    Why two sets and why the lower summary target (measured, docs/demo-robustness.md): seed 4's act calls
    copied 1.000 at step 100 while its summaries copied 0.050, and every method then scored 0.000 under
    ``claude-code``; at 1,200 steps the summaries of seeds 0-4 copy 0.74-0.98, and those at 0.74-0.78 sit
    at the level of a model that writes the newest label's code (0.78-0.83 of the codes), yet their SFT
    conclusions hold. The checks do not stop the training early: stopping at the first passing check
    (step 100 on 3 of 5 seeds) left the methods a base that learned little under ``claude-code``.
    Returns the training result and the checks ``[step, act calls, summaries]``.
    """
    from memorywalker.recipes import sft  # lazy: torch.distributed (~1 s); recipes.demo imports this module

    scripted = env.expert(cfg.expert_forget)
    none = HarnessConfig("none", max_steps=cfg.max_steps)
    records, _ = rollout(env, scripted, tokenizer, none, suite=cfg.suite, n=cfg.warm_episodes, seed=cfg.seed,
                         split="train")
    check, _ = rollout(env, scripted, tokenizer, none, suite=cfg.suite, n=cfg.warm_check_episodes, seed=cfg.seed,
                       split="test")
    summaries = []
    if cfg.warm_summaries and "claude-code" in cfg.harnesses:
        cc = HarnessConfig("claude-code", budget=cfg.budgets["claude-code"], max_steps=cfg.max_steps)
        compacted, _ = rollout(env, scripted, tokenizer, cc, suite=cfg.suite, n=cfg.warm_summaries,
                               seed=cfg.seed + 1, split="train")
        records += [one for t in compacted for one in summary_call_records(t)]
        held, _ = rollout(env, scripted, tokenizer, cc, suite=cfg.suite, n=cfg.warm_check_episodes, seed=cfg.seed,
                          split="test")
        summaries = [one for t in held for one in summary_call_records(t)]
    checks: list[list] = []

    def measure(model, step: int) -> bool:
        checks.append([step, copy_check(model, tokenizer, check, (*NAMES, *CODES)),
                       *([copy_check(model, tokenizer, summaries, CODES)] if summaries else [])])
        log(f"[warm] step {step}: copy accuracy {checks[-1][1]:.3f} in the act calls of {len(check)} held-out "
            f"episodes" + (f", {checks[-1][2]:.3f} in {len(summaries)} held-out summaries" if summaries else ""))
        return False  # a curve, not a stopping rule

    t0 = time.perf_counter()
    warm = sft.train(sft.SFTConfig(model=str(model_dir), run_dir=str(out / "warm"), method="radix",
                                   steps=cfg.warm_steps, batch_size=cfg.sft_batch, lr=cfg.warm_lr, warmup_steps=10,
                                   max_tokens=cfg.max_tokens, save_every=cfg.warm_check_every, keep_checkpoints=1,
                                   seed=cfg.seed),
                     trajectories=records, progress=progress, until=measure)
    loss = [float(m["loss"]) for m in warm.metrics]
    log(f"[warm] loss {loss[0]:.3f} -> {loss[-1]:.3f} in {warm.steps} steps, {time.perf_counter() - t0:.0f}s")
    if not warm_copies(asdict(cfg), checks[-1]):
        log(f"[warm] DID NOT LEARN TO COPY: copy accuracy {', '.join(f'{a:.3f}' for a in checks[-1][1:])} after "
            f"{warm.steps} steps (targets {cfg.warm_copy_target}, {cfg.warm_summary_target}); the methods below "
            f"are compared on a model that cannot carry a code")
    return warm, checks


@torch.no_grad()
def copy_check(model, tokenizer, episodes, words=None) -> float:
    """Greedy, teacher-forced accuracy of ``model`` on the tokens of ``words`` in ``episodes``' responses.

    Every box name and code the agent writes (in a note, a summary or the answer) is a copy of one it
    saw earlier in its context, so this is the copy skill the task needs, measured where the task needs
    it: each call's ``S_t`` in one plain forward, and at each response position whose token is one of
    ``words`` (default :data:`~memorywalker.rollout.environments.vault.env.CODES`) as the tokenizer spells it after a
    space, whether the argmax of the logits one position earlier is that token.
    """
    scored = {ids[0] for w in (CODES if words is None else words)
              if len(ids := tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1}
    was_training = model.training
    model.eval()
    renderer = Renderer(tokenizer)
    hits = total = 0
    for traj in episodes:
        for rc in renderer.render(traj).calls:
            at = [p for p in range(rc.prompt_len, len(rc.tokens)) if rc.tokens[p] in scored]
            if not at:
                continue
            logits = model(input_ids=torch.tensor([rc.tokens])).logits[0]
            predicted = logits[[p - 1 for p in at]].argmax(-1).tolist()
            hits += sum(int(a == rc.tokens[p]) for a, p in zip(predicted, at, strict=True))
            total += len(at)
    model.train(was_training)
    if not total:
        raise ValueError("copy_check: the episodes' responses hold none of the words")
    return hits / total


def summary_call_records(traj) -> list:
    """Each summarization call of ``traj`` as its own one-call record (context + summary, as delivered).

    One call is one path, so every method trains it alike: the warm start teaches summarizing as a skill
    of the base model, and the methods still differ on everything after a compaction.
    """
    table = traj.message_table()
    return [derive(traj, "summary-call", "1", index=i, messages=[*(table[m] for m in c.context), table[c.response]],
                   calls=[c], evictions=[], reward=None)
            for i, c in enumerate(traj.calls) if c.purpose == "summarize"]
