"""How long a weight sync to a ``vllm serve`` takes, ``weight_sync=shards`` against ``broadcast``, side by side.

    # in the vLLM venv (.ci/run builds it)
    python scripts/bench_weight_sync.py --model ~/.cache/memorywalker/models/smollm2-135m --repeats 4 \\
        --out runs/bench-weight-sync

One server started here (the recipe's flags; on the CPU its CPU arguments), the model's weights loaded in
this process as the trainer holds them. Each repeat moves every weight by Gaussian noise (σ = 1e-3, so
each sync carries new weights) and syncs it twice, once each way, in alternating order: **shards** =
:func:`~memorywalker.samplers.weight_sync.write_shards` into ``/dev/shm`` then
:meth:`~memorywalker.samplers.vllm_server.ServerFleet.sync_weights` (what ``RolloutServers.sync`` does),
**broadcast** = :meth:`~memorywalker.samplers.vllm_server.ServerFleet.broadcast_weights` (its group
formed at the first sync: that one's seconds are reported apart). Each sync's seconds run from the
weights in memory to the server resumed with them; each is then proven as the recipe does (the server's
prompt logprobs of a probe against a plain forward of the weights, max |Δ| reported, beside the same
gap for the server's own load of the checkpoint before any sync: the two engines' floor). Default threads.
Writes ``table.md`` and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

CPU_ARGS = "--enforce-eager --kv-cache-memory-bytes 536870912 --no-enable-chunked-prefill --max-num-batched-tokens 8192"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a local Hugging Face model directory")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--server-args", default=CPU_ARGS, help="the server's own vLLM arguments")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-weight-sync"))
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from memorywalker.samplers.vllm_server import ServerFleet, start_servers
    from memorywalker.samplers.weight_sync import write_shards
    from memorywalker.train.fsdp import main_rank_weights

    args.out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    probe = list(range(100, 164))

    @torch.no_grad()
    def plain() -> list[float]:
        lp = torch.log_softmax(model(input_ids=torch.tensor([probe])).logits[0].float(), dim=-1)
        return [lp[i - 1, t].item() for i, t in enumerate(probe) if i > 0]

    seconds: dict[str, list[float]] = {"shards": [], "broadcast": []}
    first_broadcast, worst = None, 0.0
    with start_servers(args.model, 1, log_dir=args.out / "vllm-serve", served_name="policy", tokenizer=args.tokenizer,
                       max_model_len=2048, args=args.server_args) as urls, \
            tempfile.TemporaryDirectory(prefix="bench-weight-sync-", dir="/dev/shm") as shm:
        fleet = ServerFleet(urls, model="policy")
        floor = fleet.check_sync(probe, plain(), tol=float("inf"))  # the server's own load of the same weights
        for r in range(args.repeats):
            for way in (("shards", "broadcast") if r % 2 == 0 else ("broadcast", "shards")):
                torch.manual_seed(1000 * r + len(way))
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p) * 1e-3)
                weights = main_rank_weights(model, is_main=True)
                t0 = time.perf_counter()
                if way == "shards":
                    fleet.sync_weights(shm, f"{way}-{r}", expect=write_shards(weights, shm))
                else:
                    fleet.broadcast_weights(weights, f"{way}-{r}", host="127.0.0.1")
                took = time.perf_counter() - t0
                if way == "broadcast" and first_broadcast is None:
                    first_broadcast = took
                else:
                    seconds[way].append(took)
                worst = max(worst, fleet.check_sync(probe, plain(), tol=1e-4))
        mib = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20

    rows = [{"way": w, "syncs": len(s), "median_s": statistics.median(s), "min_s": min(s), "max_s": max(s),
             "mib_per_s": mib / statistics.median(s)} for w, s in seconds.items() if s]
    ratio = rows[0]["median_s"] / rows[1]["median_s"] if len(rows) == 2 else None
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    result = {"model": args.model, "tensors": len(weights), "mib": mib, "rows": rows, "shards_over_broadcast": ratio,
              "first_broadcast_s": first_broadcast, "probe_max_abs_diff": worst,
              "probe_max_abs_diff_before_any_sync": floor, "machine": machine}
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    table = ["| way | syncs | median s | min / max s | MiB/s |", "|---|---|---|---|---|"]
    table += [f"| {r['way']} | {r['syncs']} | {r['median_s']:.2f} | {r['min_s']:.2f} / {r['max_s']:.2f} | "
              f"{r['mib_per_s']:.0f} |" for r in rows]
    table += ["", f"{len(weights)} tensors, {mib:.0f} MiB (float32); the broadcast's first sync, forming its group: "
              f"{first_broadcast:.2f} s; shards / broadcast median: {ratio:.2f}x; probe max |Δ logp| after the syncs "
              f"{worst:.2g}, before any (the server's own load of the checkpoint) {floor:.2g}"]
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
