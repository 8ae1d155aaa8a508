"""The chapter's data techniques on the demo's vault setting, each against its control, over seeds.

    python scripts/chapter_effects.py --seeds 0,1,2 --out runs/chapter [--size full|quick|tiny] [--only dagger,augment,distill,acc]

Per seed, the demo's stages 1-3 (:func:`memorywalker.recipes.demo.prepare`: kit tokenizer and model,
copy pretraining, expert episodes, the warm start; reused from ``OUT/seed-S/demo`` when a run left them),
then from that warm start:

1. **DAgger** (16.6) under ``claude-code`` compaction, with the demo's imperfect expert (careless
   summaries in ``expert_forget`` = half of its episodes) as the labeler: ``memorywalker dagger`` rounds
   (beta 1 then 0: the expert's own states, then the learner's), every label verified, retrained from the
   warm start on the aggregate; against **behaviour cloning** on the same number of verified labels, the
   act calls of the expert's own claude-code episodes that earned reward 1 (their summary calls not
   trained, as DAgger labels none). Held-out reward of both, paired, and the disagreement per round.
2. **Schema augmentation** (16.7, 16.11): SFT on the demo's expert episodes (both harnesses) with and
   without one renamed copy of each (16 interfaces, schema seeds 1-16), the same steps; evaluated on the
   familiar schema (test tasks), on a renamed one whose seed no training record used (train tasks), and
   on a renamed one with 4 distractor tools (test tasks): reward, SFA and PRE per regime, paired.
3. **Distillation** (16.9): the teacher is the demo's GRPO model (tree-mask SFT, then GRPO under
   claude-code, from this warm start); its greedy episodes on the expert's claude-code training tasks. A
   smaller student (the kit with half the decoder layers, its own pretraining and warm start, the same
   tokenizer) is fine-tuned on as many episodes from each source, in task order: the teacher's verified
   ones, the expert's verified ones, and the expert's unfiltered (what the verification buys). The
   teacher and the students evaluated, paired; how many of the teacher's episodes equal the expert's on
   the tasks both solved, counted.
4. **ACC**: each training task's first verified expert episode compiled into one long-context QA record
   (the opened boxes' observations, other boxes' as distractors, 256 tokens; ``compile-acc``); SFT on the
   expert episodes with those records mixed in against the same steps without them; held-out QA accuracy
   (the careful expert's test episodes compiled the same way) and held-out reward, each paired.

Every comparison is paired by task and seed with ``memorywalker eval``'s test (acceptance, and beside it
act calls, tokens and the malformed share: 16.11's cost and validity). Context distillation
(``distill --strip-guidance``) is not here: the vault's prompt carries no guidance, and nothing that samples
in it reads guidance text. Writes
``OUT/results.json`` and ``OUT/tables.md`` and prints the tables and the wall time; a section already in
``OUT/seed-S/<section>.json`` is read, not rerun, and a training run a cut-off section finished is reused
(so a changed section needs its OUT files removed). The tables: ``scripts/chapter_tables.py``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from chapter_tables import tables  # this script's folder is on the path when it runs

KNOWN = ("dagger", "augment", "distill", "acc")
SCHEMA_SEEDS = 16  # interfaces the augmented copies are drawn from (seeds 1..16; the held-out one is 10,000)
ACC_BUDGET = 256  # tokens of a compiled record's documents + question (2 boxes' observations and distractors)


def settings(size: str, seed: int):
    """The demo's configuration at ``size``: ``full`` (its default), ``quick`` (``demo --quick``), ``tiny`` (the
    test's: a 2-layer model trained a few steps; it shows the pipeline runs, never an effect)."""
    from memorywalker.recipes.demo import FULL, QUICK

    tiny = replace(QUICK, hidden_size=64, num_layers=2, pretrain_steps=4, pretrain_far_steps=2, warm_episodes=8,
                   warm_summaries=2, warm_steps=2, warm_check_every=1, warm_check_episodes=2, warm_copy_target=0.0,
                   warm_summary_target=0.0, sft_episodes=8, sft_steps=2, eval_tasks=2, max_steps=3, max_new_tokens=24)
    return replace({"full": FULL, "quick": QUICK, "tiny": tiny}[size], seed=seed)


def prepared(cfg, out: Path) -> dict:
    """The demo's stages 1-3 in ``out`` (or what an earlier run left there)."""
    from memorywalker.recipes.demo import prepare

    done = out / "prepare.json"
    if done.is_file() and Path((prep := json.loads(done.read_text()))["warm_dir"]).is_dir():
        return prep
    prep = {**prepare(cfg, out, progress=False), "tok_dir": str(out / "kit" / "tokenizer")}
    done.write_text(json.dumps(prep, indent=2, default=float))
    return prep


def eval_config(cfg):
    """Held-out episodes under claude-code compaction, greedy: the demo's evaluation setting."""
    from memorywalker.eval.evaluate import EvalConfig

    return EvalConfig(env="vault", world_seed=cfg.seed, suites=(cfg.suite,), compressor="claude-code",
                      budget=cfg.budgets["claude-code"],
                      max_steps=cfg.max_steps, n=cfg.eval_tasks, seed=cfg.seed, split="test", temperature=0.0,
                      max_new_tokens=cfg.max_new_tokens)


def paired(a: list[dict], b: list[dict], seed: int) -> dict:
    """``a`` minus ``b`` per task and seed, each of eval's paired metrics, with its 95 % interval."""
    from memorywalker.metrics.closed_loop import PAIRED_METRICS, paired_metric

    return {metric: paired_metric(a, b, metric, seed=seed) for metric in PAIRED_METRICS}


def sft(cfg, prep: dict, trajectories, run_dir: Path) -> str:
    """The demo's SFT (its steps, lr, batch) from the warm start on ``trajectories``; the final checkpoint."""
    from memorywalker.recipes import sft as sft_recipe

    if (run_dir / "final" / "config.json").is_file():  # finished by an earlier run of this section
        return str(run_dir / "final")
    shutil.rmtree(run_dir, ignore_errors=True)  # cut off: trained again from the start
    res = sft_recipe.train(sft_recipe.SFTConfig(
        model=prep["warm_dir"], tokenizer=prep["tok_dir"], run_dir=str(run_dir), method="radix", steps=cfg.sft_steps,
        batch_size=min(cfg.sft_batch, len(trajectories)), lr=cfg.sft_lr, warmup_steps=min(5, cfg.sft_steps - 1),
        save_every=cfg.sft_steps, seed=cfg.seed), trajectories=trajectories, progress=False)
    return str(res.final_dir)


# --- 1. DAgger against behaviour cloning on the same labels -------------------------------------------------

def dagger(cfg, prep: dict, out: Path, *, rounds: int, n: int) -> dict:
    from transformers import AutoTokenizer

    from memorywalker.eval.evaluate import load_candidate, make_env, run_suite
    from memorywalker.metrics.closed_loop import trial_row
    from memorywalker.recipes.dagger import DaggerConfig, run_dagger
    from memorywalker.records import read_trajectories
    from memorywalker.rollout import HarnessConfig

    tok_dir = prep["tok_dir"]
    ecfg = eval_config(cfg)
    dcfg = DaggerConfig(env="vault", world_seed=cfg.seed, suite=cfg.suite, compressor="claude-code", budget=cfg.budgets["claude-code"],
                        max_steps=cfg.max_steps, max_new_tokens=cfg.max_new_tokens, rounds=rounds, n=n,
                        betas=(1.0, 0.0), expert_forget=cfg.expert_forget, eval_n=cfg.eval_tasks, sft_steps=cfg.sft_steps,
                        sft_lr=cfg.sft_lr, sft_batch_size=cfg.sft_batch, sft_warmup_steps=min(5, cfg.sft_steps - 1),
                        method="radix", seed=cfg.seed)
    report = run_dagger(dcfg, prep["warm_dir"], out / "dagger", tokenizer_dir=tok_dir)
    budget = report["rounds"][-1]["dataset"]  # verified labels DAgger trained on

    # behaviour cloning: the act calls of the expert's verified claude-code episodes, as many as DAgger's labels
    expert = [t for t in read_trajectories(out / "demo" / "expert.jsonl")
              if t.meta["harness"]["name"] == "claude-code" and t.reward == 1.0]
    bc, labels = [], 0
    for t in expert:
        if labels >= budget:
            break
        calls = []
        for c in t.calls:
            keep = c.purpose == "act" and labels < budget
            labels += keep
            calls.append(c if keep else c.model_copy(update={"selected": False, "reason": "not a label of the budget"}))
        bc.append(t.model_copy(update={"calls": calls}))
    bc_dir = sft(cfg, prep, bc, out / "bc")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    env = make_env(ecfg)
    bc_rows = run_suite(env, load_candidate(bc_dir, "bc", ecfg, tokenizer=tok), HarnessConfig.of(ecfg), ecfg,
                        cfg.suite, out / "eval-bc.jsonl")
    dagger_rows = [trial_row(t) for t in read_trajectories(out / "dagger" / f"eval-round-{rounds}.jsonl")]
    return {"labels": budget, "bc_labels": labels, "bc_episodes": len(bc),
            "rounds": [{k: r[k] for k in ("round", "beta", "episodes", "episode_reward", "states", "admitted",
                                          "learner_states", "learner_state_disagreement", "held_out_reward")}
                       for r in report["rounds"]],
            "reward": {"dagger": float(np.mean([r["accepted"] for r in dagger_rows])),
                       "bc": float(np.mean([r["accepted"] for r in bc_rows])),
                       "warm": report["held_out_reward_before"]},
            "paired": paired(dagger_rows, bc_rows, cfg.seed)}


# --- 2. schema augmentation -----------------------------------------------------------------------------------

def augment(cfg, prep: dict, out: Path) -> dict:
    from transformers import AutoTokenizer

    from memorywalker.eval.evaluate import load_candidate
    from memorywalker.eval.transfer import per_task_sfa, report, transfer_rows
    from memorywalker.metrics.stats import paired_bootstrap, paired_differences
    from memorywalker.records import read_trajectories
    from memorywalker.rollout.environments.vault.env import VaultEnv
    from memorywalker.transforms.augment import augment_record, env_tools_of, make_schema_map

    expert = read_trajectories(out / "demo" / "expert.jsonl")
    copies, rejected, env = [], [], VaultEnv(cfg.seed)
    for i, t in enumerate(expert):
        try:
            copies.append(augment_record(t, make_schema_map(env_tools_of(t), 1 + i % SCHEMA_SEEDS), index=0, env=env))
        except ValueError as err:  # an old identifier survived: the copy is left out, with its reason
            rejected.append(f"{t.id}: {err}")
    tok = AutoTokenizer.from_pretrained(prep["tok_dir"])
    ecfg = eval_config(cfg)
    rows = {}
    for arm, data in (("sft", expert), ("sft+aug", expert + copies)):
        model = sft(cfg, prep, data, out / f"augment-{arm}")
        rows[arm] = transfer_rows(load_candidate(model, arm, ecfg, tokenizer=tok), ecfg, out / f"transfer-{arm}")
    result = {"records": len(expert), "copies": len(copies), "rejected": rejected, "regimes": {}}
    for regime in rows["sft"]:
        a, b = rows["sft+aug"][regime][cfg.suite], rows["sft"][regime][cfg.suite]
        d = paired_differences(per_task_sfa(a), per_task_sfa(b))
        mean, lo, hi = paired_bootstrap(d, seed=cfg.seed)
        summary = {arm: report({regime: rows[arm][regime]})[regime] for arm in rows}
        result["regimes"][regime] = {
            arm: {k: summary[arm][k] for k in ("acceptance", "sfa", "pre", "pre_calls", "proposals")} for arm in rows}
        result["regimes"][regime]["paired"] = {**paired(a, b, cfg.seed),
                                               "sfa": {"tasks": len(d), "difference": mean, "ci": [lo, hi]}}
    return result


# --- 3. distillation: a smaller student on the GRPO teacher's verified episodes against the expert's --------

def distill(cfg, prep, out: Path) -> dict:
    from transformers import AutoTokenizer

    from memorywalker.eval.evaluate import load_candidate, make_env, run_suite
    from memorywalker.recipes.demo import MethodJob, run_method
    from memorywalker.records import read_trajectories
    from memorywalker.rollout import HarnessConfig
    from memorywalker.transforms.distill import verified_success

    tok = AutoTokenizer.from_pretrained(prep["tok_dir"])
    ecfg = eval_config(cfg)
    env = make_env(ecfg)
    # the teacher: the demo's tree-mask SFT then GRPO under claude-code, from this seed's warm start
    done = out / "teacher.json"
    if not done.is_file():
        for stage in ("sft", "rl"):  # a teacher cut off is trained again from the start
            shutil.rmtree(out / "demo" / f"{stage}-teacher", ignore_errors=True)
        trained, _ = run_method(MethodJob(cfg, str(out / "demo"), "tree-mask", prep["warm_dir"], rl=True, label="teacher"))
        done.write_text(json.dumps(trained, default=float))
    trained = json.loads(done.read_text())
    teacher_dir = str(out / "demo" / "rl-teacher" / "final")
    # its greedy episodes on the expert's claude-code training tasks (the first of the train split, as the expert's)
    tcfg = replace(ecfg, split="train", n=cfg.sft_episodes // len(cfg.harnesses))
    if not (out / "teacher-episodes.jsonl").is_file():
        run_suite(env, load_candidate(teacher_dir, "teacher", tcfg, tokenizer=tok), HarnessConfig.of(tcfg), tcfg,
                  cfg.suite, out / "teacher-episodes.jsonl")
    teacher = [t for t in read_trajectories(out / "teacher-episodes.jsonl") if verified_success(t)]
    expert_all = [t for t in read_trajectories(out / "demo" / "expert.jsonl") if t.meta["harness"]["name"] == "claude-code"]
    expert = [t for t in expert_all if verified_success(t)]
    k = min(len(teacher), len(expert))  # the same number of episodes from each source, in task order
    by_task = {t.task.id: t for t in expert}
    shared = [t for t in teacher if t.task.id in by_task]
    result = {"teacher_verified": len(teacher), "expert_verified": len(expert), "episodes": k,
              "teacher_rl_reward": float(np.mean(trained["rl"]["claude-code"]["rewards"])), "shared_tasks": len(shared),
              # a verified teacher episode of a task the expert also solved: is it the expert's, message for message?
              "identical_on_shared": sum(_messages(t) == _messages(by_task[t.task.id]) for t in shared)}
    if not k:  # nothing to distil (the tiny size's teacher solves nothing): said, not trained
        return {**result, "skipped": "no verified teacher episode"}
    # the student: the demo's kit with fewer layers, its own pretraining and warm start, the same tokenizer
    scfg = replace(cfg, num_layers=max(1, cfg.num_layers // 2))  # half the decoder layers
    sprep = prepared(scfg, out / "student")
    if (Path(sprep["tok_dir"]) / "tokenizer.json").read_text() != (Path(prep["tok_dir"]) / "tokenizer.json").read_text():
        raise SystemExit(f"{out / 'student'}: its kit tokenizer differs from the teacher's; the episodes' ids would not be its")
    rows = {"teacher": run_suite(env, load_candidate(teacher_dir, "teacher", ecfg, tokenizer=tok), HarnessConfig.of(ecfg),
                                 ecfg, cfg.suite, out / "eval-teacher.jsonl")}
    # the expert's first k episodes unfiltered (its careless summaries in): what the verification itself buys
    for arm, data in (("from-teacher", teacher[:k]), ("from-expert", expert[:k]), ("from-expert-unfiltered", expert_all[:k])):
        model = sft(scfg, sprep, data, out / f"student-{arm}")
        rows[arm] = run_suite(env, load_candidate(model, arm, ecfg, tokenizer=tok), HarnessConfig.of(ecfg), ecfg,
                              cfg.suite, out / f"eval-student-{arm}.jsonl")
    return {**result, "student_layers": scfg.num_layers, "teacher_layers": cfg.num_layers,
            "acceptance": {arm: float(np.mean([r["accepted"] for r in rs])) for arm, rs in rows.items()},
            "paired": paired(rows["from-teacher"], rows["from-expert"], cfg.seed),
            "paired_filter": paired(rows["from-expert"], rows["from-expert-unfiltered"], cfg.seed)}


def _messages(t) -> list:
    return [(m.role, m.content, [(c.name, c.arguments) for c in m.tool_calls]) for m in t.messages]


# --- 4. ACC: compiled long-context QA trained in, against the same steps without it ---------------------------

def acc(cfg, prep, out: Path) -> dict:
    from collections import Counter

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorywalker.eval.evaluate import load_candidate, make_env, run_suite
    from memorywalker.metrics.stats import paired_bootstrap, paired_differences
    from memorywalker.records import read_trajectories
    from memorywalker.rollout import HarnessConfig, rollout
    from memorywalker.transforms.acc import compile_record, qa_accuracy

    tok = AutoTokenizer.from_pretrained(prep["tok_dir"])
    ecfg = eval_config(cfg)
    env = make_env(ecfg)
    expert = read_trajectories(out / "demo" / "expert.jsonl")
    compiled, rejected = {}, Counter()
    for t in expert:  # one record per task (both harnesses ran the same tasks): its first verified episode's
        if t.task.id not in compiled:
            rec, why = compile_record(t, env, tok, budget=ACC_BUDGET, seed=cfg.seed)
            compiled.update({t.task.id: rec} if rec else {})
            rejected.update([why] if why else [])
    # held-out QA: the careful expert's uncompressed episodes of the evaluation's test tasks, compiled the same way
    held, _ = rollout(env, env.expert(0.0), tok, HarnessConfig("none", max_steps=cfg.max_steps), suite=cfg.suite,
                      n=cfg.eval_tasks, seed=cfg.seed, split="test")
    heldout = [r for t in held if (r := compile_record(t, env, tok, budget=ACC_BUDGET, seed=cfg.seed)[0])]
    rows, qa = {}, {}
    for arm, data in (("sft", expert), ("sft+acc", expert + list(compiled.values()))):
        model = sft(cfg, prep, data, out / f"acc-{arm}")
        rows[arm] = run_suite(env, load_candidate(model, arm, ecfg, tokenizer=tok), HarnessConfig.of(ecfg), ecfg,
                              cfg.suite, out / f"eval-acc-{arm}.jsonl")
        qa[arm] = qa_accuracy(AutoModelForCausalLM.from_pretrained(model).eval(), tok, heldout,
                              max_new_tokens=cfg.max_new_tokens)
    d = paired_differences(qa["sft+acc"], qa["sft"])
    mean, lo, hi = paired_bootstrap(d, seed=cfg.seed)
    return {"records": len(expert), "compiled": len(compiled), "rejected": dict(rejected), "budget": ACC_BUDGET,
            "heldout_qa": len(heldout), "qa_accuracy": {arm: float(np.mean(list(v.values()))) for arm, v in qa.items()},
            "qa_per_task": qa,
            "acceptance": {arm: float(np.mean([r["accepted"] for r in rs])) for arm, rs in rows.items()},
            "paired": {**paired(rows["sft+acc"], rows["sft"], cfg.seed),
                       "qa": {"tasks": len(d), "difference": mean, "ci": [lo, hi]}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("runs/chapter"))
    ap.add_argument("--size", default="full", choices=("full", "quick", "tiny"), help="the demo's sizes (quick and tiny "
                    "show the pipeline, not effects)")
    ap.add_argument("--only", default=",".join(KNOWN), help=f"sections: {','.join(KNOWN)}")
    ap.add_argument("--dagger-rounds", type=int, default=2)
    ap.add_argument("--dagger-n", type=int, default=None, help="tasks rolled out per DAgger round (default: 40; "
                    "quick 4, tiny 2)")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(KNOWN):
        ap.error(f"--only: unknown sections {sorted(set(only) - set(KNOWN))}; valid: {','.join(KNOWN)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"size": args.size, "seeds": {}, "seconds": {}, "config": {}}
    t_all = time.monotonic()
    for seed in (int(s) for s in args.seeds.split(",")):
        cfg = settings(args.size, seed)
        out = args.out / f"seed-{seed}"
        out.mkdir(exist_ok=True)
        results["config"] = {k: v for k, v in asdict(cfg).items() if k != "seed"}
        t0 = time.monotonic()
        prep = prepared(cfg, out / "demo")
        seconds = {"prepare": round(time.monotonic() - t0, 1)}
        here = results["seeds"].setdefault(str(seed), {})
        for section in only:
            done = out / f"{section}.json"
            if done.is_file():
                here[section] = json.loads(done.read_text())
                continue
            t0 = time.monotonic()
            if section == "dagger":
                n = args.dagger_n or {"full": 40, "quick": 4, "tiny": 2}[args.size]
                here[section] = dagger(cfg, prep, out, rounds=args.dagger_rounds, n=n)
            else:
                here[section] = {"augment": augment, "distill": distill, "acc": acc}[section](cfg, prep, out)
            here[section]["seconds"] = seconds[section] = round(time.monotonic() - t0, 1)
            done.write_text(json.dumps(here[section], indent=2, default=float))
        results["seconds"][str(seed)] = seconds
        print(f"seed {seed}: {seconds}", flush=True)
    results["seconds"]["total"] = round(time.monotonic() - t_all, 1)
    # what the stages and sections took when they ran (a section read back is counted at its own run's time)
    results["seconds"]["compute"] = round(sum(
        sum(json.loads((args.out / f"seed-{s}" / "demo" / "prepare.json").read_text())["stage_seconds"].values())
        + sum(sec.get("seconds", 0) for sec in here.values()) for s, here in results["seeds"].items()), 1)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=float))
    timing = (f"Stages and sections: {results['seconds']['compute']:.0f} s, summed over seeds as they ran; this "
              f"invocation: {results['seconds']['total']:.0f} s.")
    text = tables(results)
    (args.out / "tables.md").write_text(f"{text}\n{timing}\n")
    print(text)
    print(timing)


if __name__ == "__main__":
    main()
