"""``memorywalker bench rollouts``: episodes one by one against the same episodes in lockstep.

    memorywalker bench rollouts --model runs/demo/sft-tree-mask/final --tokenizer runs/demo/kit/tokenizer
    memorywalker bench rollouts --tasks 8 --group 8 --json -

``--tasks`` tasks of ``--suite`` × ``--group`` episodes each (a GRPO step's collection) are rolled out
twice with the same seeds: one by one (:func:`~memorywalker.rollout.run_episode`, the sampler reusing its
KV cache while a context grows) and in lockstep (:func:`~memorywalker.rollout.run_episodes`, one batched
forward per token). Reported side by side: seconds of each (median over ``--repeats``), the ratio,
episodes whose response tokens agree between the two, and the largest |Δ logprob| over the calls they
share token for token (float rounding of the batched forward). JSON keys: ``config``, ``episodes``,
``calls``, ``response_tokens``, ``sequential_s``, ``lockstep_s``, ``speedup``, ``same_episodes``,
``max_abs_logprob_diff``.

``--vllm`` adds a third row: the same jobs in lockstep through a vLLM engine in this process
(:class:`~memorywalker.samplers.vllm.VLLMPolicy`, one ``generate`` per round of calls), timed after
the engine started and served one warm-up request (``vllm_start_s``, ``vllm_warmup_s`` are reported
apart). The model must be one vLLM serves (on CPU: head_dim 32, 64, 128, ...; not the default kit's 16).
JSON adds ``vllm_s``, ``vllm_episodes_per_s``, ``vllm_calls``, ``vllm_response_tokens``; every row also
has ``*_episodes_per_s``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import typer

from memorywalker.cli import renamed
from memorywalker.rollout import ENVIRONMENTS, EpisodeJob, HarnessConfig, plan, run_episode, run_episodes
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.samplers.hf import HFPolicy
from memorywalker.samplers.vllm import VLLMPolicy


def bench_rollouts(
    model: Path = typer.Option(None, "--model", exists=True, file_okay=False,
                               help="HF causal LM dir (default: the tiny random kit model)"),
    tokenizer: Path = typer.Option(None, "--tokenizer", exists=True, file_okay=False,
                                   help="tokenizer dir with a chat template (default: the model's)"),
    env: str = typer.Option("vault", help="environment: vault | websearch | corpus (suite all)"),
    suite: str = typer.Option("recall-2", help="task suite of the environment"),
    compressor: str = renamed.option("--compressor", "claude-code", "compression policy: a name of memorywalker.rollout.COMPRESSORS"),
    harness: str = renamed.old_option("--compressor"),
    budget: int = typer.Option(260, help="context budget (prompt tokens)"),
    tasks: int = typer.Option(4, min=1, help="tasks (GRPO groups)"),
    group: int = typer.Option(8, min=1, help="episodes per task"),
    temperature: float = typer.Option(1.0, min=0.0, help="sampling temperature (0 = greedy)"),
    max_new_tokens: int = typer.Option(64, min=1),
    max_steps: int = renamed.option("--max-steps", 6, "act calls per episode", min=1),
    max_turns: int = renamed.old_option("--max-steps", min=1),
    repeats: int = typer.Option(1, min=1, help="timed runs of each (median reported)"),
    seed: int = typer.Option(0),
    json_out: str = typer.Option(None, "--json", help="write the result as JSON to this path ('-' = stdout)"),
    vllm: bool = typer.Option(False, "--vllm/--no-vllm", help="also time the jobs through a vLLM engine (vllm extra)"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16: both samplers' dtype"),
) -> None:
    """Seconds to roll out the same episodes one by one and in lockstep (and with --vllm through vLLM)."""
    harness = renamed.value("--compressor", compressor, harness, "claude-code", "memorywalker bench rollouts")
    max_steps = renamed.value("--max-steps", max_steps, max_turns, 6, "memorywalker bench rollouts")
    # the vLLM row first: an engine that cannot start fails before the minutes of the HF rows
    row = run_vllm_row(model_dir=model, tokenizer_dir=tokenizer, env_name=env, suite=suite, harness=harness,
                       budget=budget, tasks=tasks, group=group, temperature=temperature, max_new_tokens=max_new_tokens,
                       max_steps=max_steps, seed=seed, dtype=dtype) if vllm else {}
    result = run_rollout_bench(model_dir=model, tokenizer_dir=tokenizer, env_name=env, suite=suite, harness=harness,
                               budget=budget, tasks=tasks, group=group, temperature=temperature,
                               max_new_tokens=max_new_tokens, max_steps=max_steps, repeats=repeats, seed=seed,
                               dtype=dtype)
    result.update(row)
    if json_out == "-":
        typer.echo(json.dumps(result, indent=2))
        return
    r = result
    typer.echo(f"{r['episodes']} episodes ({r['calls']} calls, {r['response_tokens']} response tokens), "
               f"{harness}, T = {temperature}")
    typer.echo(f"one by one: {r['sequential_s']:.2f} s   lockstep: {r['lockstep_s']:.2f} s   "
               f"speed-up: {r['speedup']:.2f}x")
    typer.echo(f"same response tokens: {r['same_episodes']} of {r['episodes']} episodes; "
               f"max |Δ logprob| on shared calls: {r['max_abs_logprob_diff']:.2e}")
    typer.echo(f"episodes/s: one by one {r['sequential_episodes_per_s']:.2f}   lockstep (hf) "
               f"{r['lockstep_episodes_per_s']:.2f}" + (f"   vllm {r['vllm_episodes_per_s']:.2f} ({r['vllm_calls']} calls, "
               f"{r['vllm_response_tokens']} response tokens; engine start {r['vllm_start_s']:.1f} s, warm-up "
               f"{r['vllm_warmup_s']:.1f} s, not counted)" if "vllm_s" in r else ""))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2))


def run_rollout_bench(*, model_dir, tokenizer_dir, env_name: str, suite: str, harness: str, budget: int, tasks: int,
                      group: int, temperature: float, max_new_tokens: int, max_steps: int, repeats: int,
                      seed: int, dtype: str = "float32") -> dict:
    from transformers import AutoTokenizer  # lazy: transformers (~1 s), only when the command runs

    if model_dir is None:
        from memorywalker.modelkit import default_kit  # lazy: the command's machinery, only when it runs

        tokenizer_dir, model_dir = default_kit()
    if env_name not in ENVIRONMENTS:
        raise typer.BadParameter(f"unknown environment {env_name!r}; valid: {', '.join(ENVIRONMENTS)}",
                                 param_hint="--env")
    world = ENVIRONMENTS[env_name](world_seed=seed)  # by name: CorpusEnv's first argument is its corpus
    tok = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    policy = HFPolicy(str(model_dir), temperature=temperature, max_new_tokens=max_new_tokens, tokenizer=tok, dtype=dtype)
    cfg = HarnessConfig(harness, budget=budget, max_steps=max_steps)
    jobs = _jobs(world, suite, tasks, group, seed, harness)

    def one_by_one():
        return [run_episode(world, j.task, policy, tok, cfg, seed=j.seed, episode_id=j.episode_id) for j in jobs]

    def lockstep():
        return run_episodes(world, jobs, policy, tok, cfg)

    times: dict[str, list[float]] = {"one_by_one": [], "lockstep": []}
    runs = {}
    for _ in range(repeats):
        for name, fn in (("one_by_one", one_by_one), ("lockstep", lockstep)):
            t0 = time.perf_counter()
            runs[name] = fn()
            times[name].append(time.perf_counter() - t0)
    seq, lock = runs["one_by_one"], runs["lockstep"]
    same, diff = 0, 0.0
    for a, b in zip(seq, lock, strict=True):
        same += [c.response_tokens for c in a.calls] == [c.response_tokens for c in b.calls]
        for ca, cb in zip(a.calls, b.calls, strict=False):
            if ca.context_tokens != cb.context_tokens or ca.response_tokens != cb.response_tokens:
                break
            diff = max([diff, *(abs(x - y) for x, y in zip(ca.rollout_logprobs, cb.rollout_logprobs, strict=True))])
    s, lk = statistics.median(times["one_by_one"]), statistics.median(times["lockstep"])
    return {"config": {"model": str(model_dir), "env": env_name, "suite": suite, "compressor": harness, "budget": budget,
                       "tasks": tasks, "group": group, "temperature": temperature, "max_new_tokens": max_new_tokens,
                       "max_steps": max_steps, "repeats": repeats, "seed": seed, "dtype": dtype},
            "episodes": len(jobs), "calls": sum(len(t.calls) for t in lock),
            "response_tokens": sum(len(c.response_tokens) for t in lock for c in t.calls),
            "sequential_s": s, "lockstep_s": lk, "speedup": s / lk, "same_episodes": same,
            "max_abs_logprob_diff": diff, "sequential_episodes_per_s": len(jobs) / s,
            "lockstep_episodes_per_s": len(jobs) / lk}


def _jobs(world, suite: str, tasks: int, group: int, seed: int, harness: str):
    return [EpisodeJob(e.task, call_seed(seed, e.task.id, j), f"{e.task.id}-r{j}")
            for e in plan(world, suite, tasks, seed=seed, harness=harness, split="train") for j in range(group)]


def run_vllm_row(*, model_dir, tokenizer_dir, env_name: str, suite: str, harness: str, budget: int, tasks: int,
                 group: int, temperature: float, max_new_tokens: int, max_steps: int, seed: int, dtype: str) -> dict:
    """The same jobs as :func:`run_rollout_bench`, in lockstep through a vLLM engine, timed once."""
    from transformers import AutoTokenizer  # lazy: transformers (~1 s), only when the command runs

    if model_dir is None:
        raise typer.BadParameter("--vllm needs --model: a model vLLM serves (the default kit's head_dim 16 is "
                                 "refused by vLLM's CPU attention)", param_hint="--model")
    world = ENVIRONMENTS[env_name](world_seed=seed)  # by name: CorpusEnv's first argument is its corpus
    tok = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    cfg = HarnessConfig(harness, budget=budget, max_steps=max_steps)
    t0 = time.perf_counter()
    from memorywalker.train.inputs import model_positions  # lazy: the command's machinery, only when it runs

    window = min(cfg.max_context + max_new_tokens, model_positions(model_dir) or cfg.max_context + max_new_tokens)
    policy = VLLMPolicy(str(model_dir), temperature=temperature, max_new_tokens=max_new_tokens, tokenizer=tok,
                        dtype=dtype, max_model_len=window, seed=seed)
    try:
        start = time.perf_counter() - t0
        t0 = time.perf_counter()
        policy.generate_batch([list(tok("warm-up")["input_ids"]) or [0]], seeds=[0])
        warmup = time.perf_counter() - t0
        jobs = _jobs(world, suite, tasks, group, seed, harness)
        t0 = time.perf_counter()
        trajs = run_episodes(world, jobs, policy, tok, cfg)
        took = time.perf_counter() - t0
    finally:
        policy.close()
    return {"vllm_s": took, "vllm_episodes_per_s": len(jobs) / took, "vllm_start_s": start, "vllm_warmup_s": warmup,
            "vllm_calls": sum(len(t.calls) for t in trajs),
            "vllm_response_tokens": sum(len(c.response_tokens) for t in trajs for c in t.calls), "vllm_dtype": dtype}
