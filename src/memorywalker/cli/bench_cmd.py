"""``memorywalker bench engines``: cost and exactness of every training method on synthetic episodes.

    memorywalker bench engines --turns 8 --evictions 3 --words 24 --trajectories 2 --repeats 3
    memorywalker bench engines --model path/to/hf-model --json bench.json

For each method one micro-batch (``--trajectories`` trees, or GRPO forests with ``--group-size``) is
run forward + backward ``--repeats`` times after one warm-up run. JSON keys (``--json PATH``, ``-`` =
stdout):

* ``config`` — the options; ``device``; ``model``; ``trees``; ``targets``; ``unique_tokens`` (U);
* ``rows`` — one per method, plus ``plain-causal`` (one causal forward/backward over the U unique
  tokens as one plain sequence: the physical limit), each with
  ``method``, ``exact`` (per DESIGN.md), ``forwards``, ``backwards``, ``tokens`` (processed, per batch),
  ``tokens_per_tree``, ``time_per_tree_s`` (median over repeats of the batch time / trees),
  ``times_s`` (every repeat, per batch), ``peak_memory_mib`` (CUDA: ``max_memory_allocated``; CPU:
  peak growth of the glibc heap in use, sampled every millisecond), ``memory_kind``, ``max_abs_logprob_diff``
  (max over targets of |logprob − per-call logprob|; lost targets excluded), ``lost_targets``.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import threading
import time
from pathlib import Path

import typer

EXACT = {"per-call": "exact (reference)", "logit-tree": "exact", "tree-mask": "exact", "sdcc": "bounded (KL)",
         "dfs": "naive", "rightmost": "naive", "plain-causal": "limit"}
ORDER = ["per-call", "logit-tree", "tree-mask", "sdcc", "dfs", "rightmost"]


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Benchmarks (not timed tests).", no_args_is_help=True)
    bench.command("engines")(bench_engines)
    app.add_typer(bench, name="bench")


def bench_engines(
    turns: int = typer.Option(8, help="model calls per episode"),
    evictions: int = typer.Option(3, help="compression events per episode (< turns)"),
    words: int = typer.Option(24, help="words per response and per tool result"),
    retries: int = typer.Option(0, help="calls re-issued with the same context (branch at a response start)"),
    trajectories: int = typer.Option(2, help="trees in the micro-batch"),
    group_size: int = typer.Option(1, help="rollouts per tree (>1: GRPO forests merged at the prompt)"),
    repeats: int = typer.Option(3, help="timed runs per method (median reported)"),
    methods: str = typer.Option(",".join(ORDER), help="comma-separated methods"),
    model: Path = typer.Option(None, "--model", help="HF model dir with a chat-template tokenizer; default: tiny kit"),
    arch: str = typer.Option("llama", help="tiny kit architecture when --model is not given: llama | qwen2"),
    attention: str = typer.Option("sdpa", help="sdpa | eager | flex"),
    max_tokens: int = typer.Option(8192, help="buffer size for packed methods (tree-mask, dfs, rightmost)"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    seed: int = typer.Option(0),
    json_out: str = typer.Option(None, "--json", help="write the results as JSON to this path ('-' = stdout)"),
) -> None:
    """Tokens, passes, time per tree, peak memory and logprob error vs per-call, per method."""
    from memorywalker.engine import METHODS

    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise typer.BadParameter(f"unknown methods {unknown}; valid: {sorted(METHODS)}")
    if evictions >= turns:
        raise typer.BadParameter(f"--evictions ({evictions}) must be < --turns ({turns})")
    result = run_bench(turns=turns, evictions=evictions, words=words, retries=retries, trajectories=trajectories,
                       group_size=group_size, repeats=repeats, methods=chosen, model_dir=model, arch=arch,
                       attention=attention, max_tokens=max_tokens, dtype=dtype, device=device, seed=seed)
    if json_out == "-":
        typer.echo(json.dumps(result, indent=2))
        return
    _print_table(result)
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2))


def run_bench(*, turns: int, evictions: int, words: int, retries: int, trajectories: int, group_size: int,
              repeats: int, methods: list[str], model_dir: Path | None, arch: str, attention: str,
              max_tokens: int, dtype: str, device: str, seed: int) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorywalker.engine import EngineConfig, run
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
    from memorywalker.layout import Batch
    from memorywalker.modelkit import default_kit
    from memorywalker.render import Renderer

    if model_dir is None:
        tok_dir, model_dir = default_kit(arch=arch)
    else:
        tok_dir = model_dir
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(dev)
    model.train()
    renderer = Renderer(AutoTokenizer.from_pretrained(tok_dir))

    groups = []
    for i in range(trajectories):
        spec = SyntheticSpec(turns=turns, evictions=evictions, words=words, retries=retries, seed=seed + i)
        trajs = (synthetic_group(spec, f"bench-{i}", group_size) if group_size > 1
                 else [synthetic_trajectory(spec, f"bench-{i}")])
        groups.append([renderer.render(t) for t in trajs])
    batch = Batch.from_groups(groups, renderer=renderer)
    n_trees = len(batch.trees)
    unique = sum(len(t) for t in batch.trees)

    def timed(fn):
        fn()  # warm-up: allocator, kernels, compilation
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

    rows, reference = [], None
    for method in (["per-call"] if "per-call" not in methods else []) + methods:
        cfg = EngineConfig(method=method, attention=attention, max_tokens=max_tokens)
        res, times, peak, kind = timed(lambda cfg=cfg: run(model, batch, cfg))
        lp = res.logprobs.float().cpu().numpy()
        if method == "per-call":
            reference = lp
            if "per-call" not in methods:
                continue
        ok = np.isfinite(lp)
        rows.append(_row(method, res.metrics["forwards"], res.metrics["backwards"], res.metrics["tokens"], n_trees,
                         times, peak, kind, float(np.abs(lp[ok] - reference[ok]).max()) if ok.any() else None,
                         int(res.metrics["lost_targets"])))

    # plain causal: the U unique tokens as one sequence, one forward/backward, no mask (is_causal kernel)
    ids = torch.from_numpy(np.concatenate([t.token_ids for t in batch.trees]))[None].to(dev)

    def causal():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
        loss.backward()
        return loss

    _, times, peak, kind = timed(causal)
    rows.append(_row("plain-causal", 1, 1, unique, n_trees, times, peak, kind, None, 0))
    return {
        "config": dict(turns=turns, evictions=evictions, words=words, retries=retries, trajectories=trajectories,
                       group_size=group_size, repeats=repeats, attention=attention, max_tokens=max_tokens,
                       dtype=dtype, seed=seed),
        "device": str(dev) if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        "model": str(model_dir),
        "trees": n_trees,
        "targets": len(batch.targets),
        "unique_tokens": unique,
        "rows": rows,
    }


def _row(method, forwards, backwards, tokens, n_trees, times, peak, memory_kind, diff, lost) -> dict:
    return {
        "method": method,
        "exact": EXACT[method],
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
    title = (f"engines on {result['device']}: {result['trees']} trees x {c['group_size']} rollouts, {c['turns']} calls, "
             f"{c['evictions']} evictions, {result['targets']} targets, U = {result['unique_tokens']} tokens")
    table = Table(title=title)
    for col in ("method", "exact", "fwd", "bwd", "tokens/tree", "ms/tree", "peak MiB", "max |Δlogp| vs per-call", "lost"):
        table.add_column(col, justify="left" if col in ("method", "exact") else "right")
    for r in result["rows"]:
        diff = "-" if r["max_abs_logprob_diff"] is None else f"{r['max_abs_logprob_diff']:.2e}"
        table.add_row(r["method"], r["exact"], str(r["forwards"]), str(r["backwards"]), f"{r['tokens_per_tree']:.0f}",
                      f"{1000 * r['time_per_tree_s']:.1f}", f"{r['peak_memory_mib']:.1f}", diff, str(r["lost_targets"]))
    Console(width=max(Console().width, 150)).print(table)
    typer.echo(f"peak memory: {result['rows'][-1]['memory_kind']}")
