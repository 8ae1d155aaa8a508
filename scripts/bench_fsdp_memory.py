"""Peak CPU memory per rank of the SFT recipe with parallel=ddp vs parallel=fsdp (gloo ranks).

    OMP_NUM_THREADS=1 python scripts/bench_fsdp_memory.py [--model DIR | --hidden 1024 --layers 8
        --intermediate 2048 [--vocab-size 151936]] [--ranks 2] [--parallel ddp,fsdp] [--steps 2]
        [--batch-size 4] [--method radix] [--calls 2,8,14,20] [--activation-checkpointing] [--where]

Each rank trains ``--steps`` SFT steps on synthetic episodes whose trees differ in size (episode i has
``calls[i mod len(calls)]`` calls, one eviction per 3 calls), so the ranks run different numbers of
forwards and backwards, and samples its heap in use (glibc mallinfo2, every ms; memorywalker.bench.memory) from
before the model loads: ``train peak`` is the largest increase up to the end of the last optimizer step,
``run peak`` up to the end of the run (the final export included). ``held`` is what the rank holds at
the end of the last step: parameters + AdamW moments, as local tensor bytes (shards under fsdp);
``shards alone`` adds a gradient of the trainable parameters' local size: what a rank needs at least
during a step if nothing were ever gathered (fsdp: 16 bytes per fp32 parameter / ranks).
``--hidden`` builds a random model of the kit architecture at that size (nothing downloaded).
``--where``: each rank also logs the step's events (the row-sharded head's and embedding's gathers and
releases, the chunked loss's backward, FSDP's post-backwards, the optimizer step) and the table names the
events on either side of its peak.

The weights are copied into the heap as they load (both runs): from_pretrained leaves them in a
memory map of the safetensors file, which the heap probe does not see, so a DDP rank's whole parameter
set would be missing from its number while a FSDP rank's shards (copies) count. On a GPU they would be
device memory either way.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _local_bytes(t) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _log_events(events: list) -> None:
    """Record (perf_counter, name) around the step's memory-relevant events (wrapping them in place)."""
    import inspect
    import time

    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup  # private: observed only

    from memorywalker.engine import head
    from memorywalker.recipes import sft
    from memorywalker.train import row_shards

    def logged(owner, name, label):
        real = getattr(owner, name)

        def call(*a, **kw):
            who = label(*a)
            events.append((time.perf_counter(), f"{who} starts"))
            try:
                return real(*a, **kw)
            finally:
                events.append((time.perf_counter(), f"{who} ends"))
        static = isinstance(inspect.getattr_static(owner, name), staticmethod)  # an autograd Function's backward
        setattr(owner, name, staticmethod(call) if static else call)

    logged(row_shards.RowShards, "gather", lambda self: f"{type(self).__name__}.gather")
    logged(row_shards.RowShards, "release", lambda self, **_: f"{type(self).__name__}.release")
    logged(head._LinearLabelLogprob, "backward", lambda *_: "the chunked loss's backward")
    logged(FSDPParamGroup, "post_backward", lambda g, *_: f"post-backward of {g._module_fqn or 'the root'}")
    logged(sft, "optimizer_step", lambda *_: "the optimizer step")


def _around(events: list, at: float) -> str:
    before = [n for t, n in events if t <= at][-1:] or ["the start"]
    after = [n for t, n in events if t > at][:1] or ["the end"]
    return f"after {before[0]}, before {after[0]}"


def _worker(rank: int, world: int, port: int, args, parallel: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from memorywalker.bench.memory import PeakMemory
    from memorywalker.engine.synthetic import SyntheticSpec, synthetic_trajectory
    from memorywalker.recipes import sft
    from memorywalker.train import step as step_mod

    held = {}
    real_step = step_mod.optimizer_step

    def measured_step(model, optimizer, **kw):  # what the rank holds right after the update, the peak so far
        norm = real_step(model, optimizer, **kw)
        params = list(model.parameters())
        held["state_bytes"] = sum(_local_bytes(p) for p in params) + sum(
            _local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
        held["grad_bytes"] = sum(_local_bytes(p) for p in params if p.requires_grad)
        held["train_peak_mib"] = (max(peak.peak, peak.probe()) - peak.base) / 2**20
        return norm

    sft.optimizer_step = measured_step
    events: list[tuple[float, str]] = []
    if args.where:
        _log_events(events)
    real_load = sft.load_model

    def load_into_heap(*a, **kw):  # the weights out of the file's memory map (see the docstring)
        model, tok = real_load(*a, **kw)
        for t in [*model.parameters(), *model.buffers()]:
            t.data = t.data.clone()
        return model, tok

    sft.load_model = load_into_heap
    calls = [args.calls[i % len(args.calls)] for i in range(args.batch_size)]
    data = [synthetic_trajectory(SyntheticSpec(turns=n, evictions=n // 3, words=24, seed=i), f"ep-{i}")
            for i, n in enumerate(calls)]
    with PeakMemory(torch.device("cpu")) as peak:
        result = sft.train(sft.SFTConfig(model=args.model, tokenizer=args.tokenizer, run_dir=f"{out}/{parallel}",
                                         steps=args.steps, batch_size=args.batch_size, parallel=parallel,
                                         method=args.method, activation_checkpointing=args.activation_checkpointing,
                                         save_every=10**6), trajectories=data, progress=False)
    Path(f"{out}/{parallel}-rank{rank}.json").write_text(json.dumps(
        {"peak_mib": peak.peak_mib, "train_peak_mib": held["train_peak_mib"], "state_mib": held["state_bytes"] / 2**20,
         "shards_mib": (held["state_bytes"] + held["grad_bytes"]) / 2**20, "where": _around(events, peak.peak_at),
         "kind": peak.kind, "losses": [m["loss"] for m in result.metrics]}))
    torch.distributed.destroy_process_group()


def main() -> None:
    from transformers import AutoModelForCausalLM

    from memorywalker.modelkit import build_model, default_kit

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="local HF model dir (default: the kit model)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--method", default="radix")
    ap.add_argument("--hidden", type=int, help="build a random kit-architecture model of this width")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, help="MLP width (default 2 x hidden)")
    ap.add_argument("--vocab-size", type=int,
                    help="with --hidden: a real model's vocabulary (e.g. 151936; default the kit's)")
    ap.add_argument("--calls", type=lambda v: [int(x) for x in v.split(",")], default=[2, 8, 14, 20],
                    help="calls per episode, cycled over the batch (default 2,8,14,20)")
    ap.add_argument("--activation-checkpointing", action="store_true", help="under both ddp and fsdp")
    ap.add_argument("--ranks", type=int, default=2, help="gloo processes (default 2)")
    ap.add_argument("--where", action="store_true", help="name the events around each rank's peak")
    ap.add_argument("--parallel", type=lambda v: v.split(","), default=["ddp", "fsdp"],
                    help="which modes to run, comma-separated (default ddp,fsdp)")
    args = ap.parse_args()
    tok, model = default_kit()
    args.model, args.tokenizer = args.model or str(model), str(tok)
    from transformers import AutoConfig

    with tempfile.TemporaryDirectory() as out:
        if args.hidden:
            args.model = str(build_model(f"{out}/model", tok, hidden_size=args.hidden, num_layers=args.layers,
                                         intermediate_size=args.intermediate, vocab_size=args.vocab_size))
        n = AutoConfig.from_pretrained(args.model)
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(n).parameters())
        for parallel in args.parallel:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(_worker, args=(args.ranks, port, args, parallel, out), nprocs=args.ranks, join=True)
        runs = {(par, rank): json.loads(Path(f"{out}/{par}-rank{rank}.json").read_text())
                for par in args.parallel for rank in range(args.ranks)}
    print(f"model: hidden {n.hidden_size}, {n.num_hidden_layers} layers, intermediate {n.intermediate_size}, "
          f"vocab {n.vocab_size}, {params / 1e6:.1f}M parameters; {args.ranks} gloo ranks, {args.steps} SFT steps "
          f"({args.method}{', activation checkpointing' if args.activation_checkpointing else ''}), batch "
          f"{args.batch_size}, trees of {args.calls} calls")
    print("| parallel | rank | train peak MiB | run peak MiB (export incl.) | params + AdamW moments held, MiB "
          "| shards alone (+ gradients), MiB | losses |")
    print("|---|---|---|---|---|---|---|")
    for (par, rank), r in runs.items():
        print(f"| {par} | {rank} | {r['train_peak_mib']:.1f} | {r['peak_mib']:.1f} | {r['state_mib']:.2f} | "
              f"{r['shards_mib']:.2f} | {', '.join(f'{x:.6f}' for x in r['losses'])} |")

    def worst(par, key):
        return max(runs[par, r][key] for r in range(args.ranks))

    if {"ddp", "fsdp"} <= set(args.parallel):
        for key in ("train_peak_mib", "peak_mib"):
            print(f"fsdp / ddp, {key.replace('_mib', '').replace('_', ' ')} (worst rank each): "
                  f"{worst('fsdp', key) / worst('ddp', key):.2f}")
    for par in args.parallel:
        above = worst(par, "train_peak_mib") - worst(par, "shards_mib")
        print(f"{par}: train peak over the shards alone (worst rank): {above:.0f} MiB")
    if args.where:
        for (par, rank), r in runs.items():
            print(f"{par} rank {rank}: the run's peak came {r['where']}")
    print(f"memory: {next(iter(runs.values()))['kind']}")


if __name__ == "__main__":
    main()
