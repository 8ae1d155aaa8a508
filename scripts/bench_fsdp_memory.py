"""Peak CPU memory per rank of the SFT recipe with parallel=ddp vs parallel=fsdp (2 gloo ranks).

    OMP_NUM_THREADS=1 python scripts/bench_fsdp_memory.py [--model DIR] [--steps 2] [--batch-size 4]

Each rank trains ``--steps`` SFT steps on synthetic episodes (3 calls, 1 eviction, radix) and samples
its heap in use (glibc mallinfo2, every ms; memorywalker.bench.memory) from before the model
loads to the end of the run: ``peak`` is the largest increase. ``state`` is what the rank holds at the
end of the last step: parameters + AdamW moments, as local tensor bytes (shards under fsdp).
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

    def measured_step(model, optimizer, **kw):  # what the rank holds right after the update
        norm = real_step(model, optimizer, **kw)
        params = list(model.parameters())
        held["state_bytes"] = sum(_local_bytes(p) for p in params) + sum(
            _local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
        return norm

    sft.optimizer_step = measured_step
    data = [synthetic_trajectory(SyntheticSpec(turns=3, evictions=1, words=24, seed=i), f"ep-{i}")
            for i in range(args.batch_size)]
    with PeakMemory(torch.device("cpu")) as peak:
        sft.train(sft.SFTConfig(model=args.model, tokenizer=args.tokenizer, run_dir=f"{out}/{parallel}", steps=args.steps,
                                batch_size=args.batch_size, parallel=parallel, save_every=10**6), trajectories=data,
                  progress=False)
    Path(f"{out}/{parallel}-rank{rank}.json").write_text(json.dumps(
        {"peak_mib": peak.peak_mib, "state_mib": held["state_bytes"] / 2**20, "kind": peak.kind}))
    torch.distributed.destroy_process_group()


def main() -> None:
    from memorywalker.modelkit import default_kit

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="local HF model dir (default: the kit model)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    tok, model = default_kit()
    args.model, args.tokenizer = args.model or str(model), str(tok)
    from transformers import AutoConfig

    n = AutoConfig.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as out:
        for parallel in ("ddp", "fsdp"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(_worker, args=(2, port, args, parallel, out), nprocs=2, join=True)
        print(f"model {args.model} (hidden {n.hidden_size}, {n.num_hidden_layers} layers), 2 gloo ranks, "
              f"{args.steps} SFT steps, batch {args.batch_size}")
        print("| parallel | rank | peak heap MiB | params + AdamW moments held after the step, MiB |")
        print("|---|---|---|---|")
        for parallel in ("ddp", "fsdp"):
            for rank in range(2):
                r = json.loads(Path(f"{out}/{parallel}-rank{rank}.json").read_text())
                print(f"| {parallel} | {rank} | {r['peak_mib']:.1f} | {r['state_mib']:.2f} |")
        print(f"memory: {r['kind']}")


if __name__ == "__main__":
    main()
