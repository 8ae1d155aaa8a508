"""``memorywalker bench engines``: cost and exactness of every training method, on synthetic episodes
or on real imported trajectories.

    memorywalker bench engines --turns 8 --evictions 3 --words 24 --trajectories 2 --repeats 3
    memorywalker bench engines --model path/to/hf-model --json bench.json
    memorywalker bench engines --data sessions.jsonl --tokenizer DIR --max-calls 50 --sample-calls 4

For each method one micro-batch (``--trajectories`` synthetic trees, GRPO forests with ``--group-size``,
or the trajectories of ``--data``, each its own tree) is run forward + backward ``--repeats`` times after
one warm-up run. Exactness is measured against an independent reference: a plain ``model(input_ids)``
forward over each call's ``S_t`` (default positions, the model's own causal attention, no engine code).
With ``--sample-calls S`` the reference and the ``per-call`` row cover S random calls only and the
``per-call`` time is extrapolated to every call (× T/S; the row says so). JSON keys (``--json PATH``,
``-`` = stdout):

* ``config`` — the options; ``device``; ``model``; ``trees``; ``targets``; ``unique_tokens`` (U);
  ``per_call_tokens`` (P); ``calls`` (T); ``reference_calls``;
* ``rows`` — one per method, plus ``plain-causal`` (one causal forward/backward over the U unique
  tokens as one plain sequence: the physical limit; ``--no-plain-causal`` skips it), each with
  ``method``, ``exact`` (the registry's exactness class), ``forwards``, ``backwards``, ``tokens``
  (processed, per batch), ``tokens_per_tree``, ``time_per_tree_s`` (median over repeats of the batch
  time / trees), ``times_s`` (every repeat, per batch), ``peak_memory_mib`` (CUDA:
  ``max_memory_allocated``; CPU: peak growth of the glibc heap in use, sampled every millisecond),
  ``memory_kind``, ``max_abs_logprob_diff`` (max over the reference calls' targets of |logprob − plain
  per-call logprob|; lost targets excluded), ``lost_targets``, ``extrapolated`` (per-call on a sample:
  the times are scaled to all calls).
"""

from __future__ import annotations

import ctypes
import json
import random
import statistics
import threading
import time
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Benchmarks (not timed tests).", no_args_is_help=True)
    bench.command("engines")(bench_engines)
    from memorywalker.cli.bench_rollouts import bench_rollouts

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
    model: Path = typer.Option(None, "--model", help="HF model dir with a chat-template tokenizer; default: tiny kit"),
    arch: str = typer.Option("llama", help="tiny kit architecture when --model is not given: llama | qwen2"),
    attention: str = typer.Option("sdpa", help="mask-schedule attention: sdpa | eager | flex"),
    max_tokens: int = typer.Option(8192, help="tokens per forward (packed buffer / radix chunk)"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    seed: int = typer.Option(0),
    json_out: str = typer.Option(None, "--json", help="write the results as JSON to this path ('-' = stdout)"),
) -> None:
    """Tokens, passes, time per tree, peak memory and logprob error vs a plain per-call forward, per method."""
    from memorywalker.engine.methods import method_names, parse_methods

    try:
        chosen = list(parse_methods(methods)) if methods else method_names()
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--methods") from None
    if data is None and evictions >= turns:
        raise typer.BadParameter(f"--evictions ({evictions}) must be < --turns ({turns})")
    result = run_bench(turns=turns, evictions=evictions, words=words, retries=retries, trajectories=trajectories,
                       group_size=group_size, data=data, tokenizer_dir=tokenizer, max_calls=max_calls,
                       sample_calls=sample_calls, plain_causal=plain_causal, repeats=repeats, warmup=warmup,
                       methods=chosen,
                       model_dir=model, arch=arch, attention=attention, max_tokens=max_tokens, dtype=dtype,
                       device=device, seed=seed)
    if json_out == "-":
        typer.echo(json.dumps(result, indent=2))
        return
    _print_table(result)
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2))


def _first_calls(traj, n: int | None):
    """``traj`` cut to its first ``n`` calls (evictions before a dropped call go with it)."""
    if n is None or n >= len(traj.calls):
        return traj
    kept = {c.id for c in traj.calls[:n]}
    return traj.model_copy(update={"calls": traj.calls[:n],
                                   "evictions": [e for e in traj.evictions if e.before_call in kept]})


def _only_calls(rt, keep: set[int]):
    """A rendered trajectory whose calls outside ``keep`` have no targets (the tree stays the same)."""
    from dataclasses import replace

    calls = [c if c.index in keep else replace(c, targets=[], target_logprobs=[], selected=False) for c in rt.calls]
    return replace(rt, calls=calls)


def plain_per_call_logprobs(model, rendered, calls: dict[str, set[int]]) -> dict[tuple[str, int, int], float]:
    """Independent reference: for each chosen call, one plain ``model(input_ids=S_t)`` forward (the model's
    own causal attention and default positions, no memorywalker buffer, mask or label helper) and
    log p(S_t[i] | S_t[:i]) at each target i. Keys: (trajectory id, call index, target position in S_t)."""
    import torch

    device = next(model.parameters()).device
    out = {}
    with torch.no_grad():
        for rt in rendered:
            for rc in rt.calls:
                if rc.index not in calls.get(rt.id, ()) or not rc.targets:
                    continue
                ids = torch.tensor([rc.tokens], device=device)
                logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].float(), -1)
                for i in rc.targets:
                    out[(rt.id, rc.index, i)] = float(logp[i - 1, rc.tokens[i]])
    return out


def run_bench(*, turns: int, evictions: int, words: int, retries: int, trajectories: int, group_size: int,
              repeats: int, methods: list[str], model_dir: Path | None, arch: str, attention: str,
              max_tokens: int, dtype: str, device: str, seed: int, data: Path | None = None,
              tokenizer_dir: Path | None = None, max_calls: int | None = None, sample_calls: int | None = None,
              plain_causal: bool = True, warmup: int = 1) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorywalker.engine import EngineConfig, needs_full_view, run
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
    from memorywalker.layout import Batch
    from memorywalker.modelkit import default_kit
    from memorywalker.records import TrajectoryReader
    from memorywalker.render import Renderer

    if model_dir is None:
        tok_dir, model_dir = default_kit(arch=arch)
    else:
        tok_dir = model_dir
    tok_dir = tokenizer_dir or tok_dir
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(dev)
    model.train()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    renderer = Renderer(tok)
    full_view = needs_full_view(methods)

    if data is not None:
        trajs = [_first_calls(t, max_calls) for t in TrajectoryReader(data, vocab_size=len(tok))]
        if not trajs:
            raise typer.BadParameter(f"{data}: no valid trajectory")
        groups = [[renderer.render(t, full_view=full_view)] for t in trajs]
    else:
        groups = []
        for i in range(trajectories):
            spec = SyntheticSpec(turns=turns, evictions=evictions, words=words, retries=retries, seed=seed + i)
            ts = (synthetic_group(spec, f"bench-{i}", group_size) if group_size > 1
                  else [synthetic_trajectory(spec, f"bench-{i}")])
            groups.append([renderer.render(t, full_view=full_view) for t in ts])
    batch = Batch.from_groups(groups)
    n_trees = len(batch.trees)
    unique = sum(len(t) for t in batch.trees)
    rendered = [rt for g in groups for rt in g]
    with_targets = [(rt.id, rc.index) for rt in rendered for rc in rt.calls if rc.targets]
    per_call_tokens = sum(len(rc.tokens) for rt in rendered for rc in rt.calls if rc.targets)
    chosen = _sample_calls(batch, with_targets, sample_calls, seed)
    ref_calls: dict[str, set[int]] = {}
    for tid, ci in chosen:
        ref_calls.setdefault(tid, set()).add(ci)
    reference = plain_per_call_logprobs(model, rendered, ref_calls)

    def keys_of(b: Batch) -> list[tuple[str, int, int]]:
        out = []
        for tree, c, p in zip(b.target_tree, b.targets.call, b.targets.position, strict=True):
            row = b.calls[c]
            tid = b.trees[tree].trajectory_ids[row.trajectory]
            out.append((tid, row.index, int(b.trees[tree].depth[p])))  # depth = index inside S_t
        return out

    def timed(fn):
        for _ in range(warmup):  # allocator, kernels, compilation
            fn()
        times, peak = [], 0.0
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            with _PeakMemory(dev) as mem:
                t0 = time.perf_counter()
                out = fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            peak = max(peak, mem.peak_mib)
        return out, times, peak, mem.kind

    rows = []
    sampled = len(chosen) < len(with_targets)
    for method in methods:
        cfg = EngineConfig(method=method, attention=attention, max_tokens=max_tokens)
        mb = batch
        if method == "per-call" and sampled:  # only the sampled calls carry targets: one forward each
            mb = Batch.from_groups([[_only_calls(rt, ref_calls.get(rt.id, set())) for rt in g] for g in groups])
        res, times, peak, kind = timed(lambda cfg=cfg, mb=mb: run(model, mb, cfg))
        scale = len(with_targets) / len(chosen) if mb is not batch else 1.0
        lp = res.logprobs.float().cpu().numpy()
        diffs = [abs(lp[i] - reference[k]) for i, k in enumerate(keys_of(mb)) if k in reference and np.isfinite(lp[i])]
        row = _row(method, get_exactness(method), res.metrics["forwards"], res.metrics["backwards"],
                   res.metrics["processed_tokens"], n_trees, [t * scale for t in times], peak, kind,
                   float(max(diffs)) if diffs else None, int(res.metrics["lost_targets"]))
        row["extrapolated"] = scale != 1.0
        if scale != 1.0:
            row["forwards"] = round(row["forwards"] * scale)
            row["backwards"] = round(row["backwards"] * scale)
            row["tokens"] = per_call_tokens
            row["tokens_per_tree"] = per_call_tokens / n_trees
        rows.append(row)

    if plain_causal:
        # plain causal: the U unique tokens as one sequence, one forward/backward, no mask (is_causal kernel)
        ids = torch.from_numpy(np.concatenate([t.token_ids for t in batch.trees]))[None].to(dev)

        def causal():
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
            loss.backward()
            return loss

        _, times, peak, kind = timed(causal)
        rows.append(_row("plain-causal", "limit", 1, 1, unique, n_trees, times, peak, kind, None, 0))
        rows[-1]["extrapolated"] = False
    return {
        "config": dict(turns=turns, evictions=evictions, words=words, retries=retries, trajectories=trajectories,
                       group_size=group_size, repeats=repeats, warmup=warmup, attention=attention, max_tokens=max_tokens,
                       dtype=dtype, seed=seed, data=None if data is None else str(data), max_calls=max_calls,
                       sample_calls=sample_calls),
        "device": str(dev) if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        "model": str(model_dir),
        "trees": n_trees,
        "targets": len(batch.targets),
        "unique_tokens": unique,
        "per_call_tokens": per_call_tokens,
        "calls": len(with_targets),
        "reference_calls": len(chosen),
        "rows": rows,
    }


def _sample_calls(batch, with_targets: list[tuple[str, int]], n: int | None, seed: int) -> list[tuple[str, int]]:
    """``n`` calls with targets: one random call of each segment first (so calls after every
    compaction are covered while n allows), then random others. All of them when n is None or ≥ T."""
    if n is None or n >= len(with_targets):
        return with_targets
    rng = random.Random(seed)
    has_targets = set(with_targets)
    by_segment: dict[tuple[str, int, int], list[tuple[str, int]]] = {}
    for tree in batch.trees:
        for c in tree.calls:
            key = (tree.trajectory_ids[c.trajectory], c.index)
            if key in has_targets:
                by_segment.setdefault((key[0], c.trajectory, c.segment), []).append(key)
    segments = list(by_segment.values())
    rng.shuffle(segments)
    chosen = [rng.choice(calls) for calls in segments[:n]]
    rest = [k for k in with_targets if k not in set(chosen)]
    return chosen + rng.sample(rest, n - len(chosen))


def get_exactness(method: str) -> str:
    from memorywalker.engine import get_method

    return get_method(method).exactness


def _row(method, exact, forwards, backwards, tokens, n_trees, times, peak, memory_kind, diff, lost) -> dict:
    return {
        "method": method,
        "exact": exact,
        "forwards": int(forwards),
        "backwards": int(backwards),
        "tokens": int(tokens),
        "tokens_per_tree": tokens / n_trees,
        "time_per_tree_s": statistics.median(times) / n_trees,
        "times_s": times,
        "peak_memory_mib": peak,
        "memory_kind": memory_kind,
        "max_abs_logprob_diff": diff,
        "lost_targets": lost,
    }


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _cpu_bytes_probe():
    """A function returning the bytes the process has in use: glibc's heap in use (``mallinfo2``:
    allocated chunks + mmapped blocks, where torch's CPU tensors live) or, elsewhere, the RSS."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2

        def heap() -> int:
            mi = libc.mallinfo2()
            return mi.uordblks + mi.hblkhd

        heap()
        return heap, "cpu heap in use (glibc mallinfo2, sampled)"
    except (OSError, AttributeError):
        import psutil

        proc = psutil.Process()
        return (lambda: proc.memory_info().rss), "cpu rss growth (sampled)"


class _PeakMemory:
    """Peak memory of a block above what was in use when it started: CUDA ``max_memory_allocated``, or
    on CPU the heap in use sampled by a thread every millisecond (tracemalloc does not see torch's
    CPU allocator, and a warm process's RSS barely moves)."""

    def __init__(self, device):
        self.device = device
        self.peak_mib = 0.0
        self.kind = "cuda max_memory_allocated"

    def __enter__(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.probe, self.kind = _cpu_bytes_probe()
        self.base = self.peak = self.probe()
        self.stop = threading.Event()

        def sample():
            while not self.stop.is_set():
                self.peak = max(self.peak, self.probe())
                time.sleep(0.001)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, self.probe())
            self.peak_mib = (self.peak - self.base) / 2**20
        return False


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = result["config"]
    what = (f"{c['data']}" if c["data"] else
            f"{c['group_size']} rollouts, {c['turns']} calls, {c['evictions']} evictions")
    title = (f"engines on {result['device']}: {result['trees']} trees ({what}), {result['calls']} calls, "
             f"{result['targets']} targets, U = {result['unique_tokens']} tokens, P = {result['per_call_tokens']}")
    table = Table(title=title)
    for col in ("method", "exact", "fwd", "bwd", "tokens/tree", "ms/tree", "peak MiB",
                "max |Δlogp| vs plain per-call", "lost"):
        table.add_column(col, justify="left" if col in ("method", "exact") else "right")
    for r in result["rows"]:
        diff = "-" if r["max_abs_logprob_diff"] is None else f"{r['max_abs_logprob_diff']:.2e}"
        name = r["method"] + (" (extrapolated)" if r.get("extrapolated") else "")
        table.add_row(name, r["exact"], str(r["forwards"]), str(r["backwards"]), f"{r['tokens_per_tree']:.0f}",
                      f"{1000 * r['time_per_tree_s']:.1f}", f"{r['peak_memory_mib']:.1f}", diff, str(r["lost_targets"]))
    Console(width=max(Console().width, 150)).print(table)
    if result["reference_calls"] < result["calls"]:
        typer.echo(f"reference: plain per-call forwards on {result['reference_calls']} random calls of "
                   f"{result['calls']}; per-call time measured on them and scaled by calls")
    typer.echo(f"peak memory: {result['rows'][-1]['memory_kind']}")
