"""Peak memory of one radix forward + backward over a long chain, with and without checkpoint_chunks.

    python scripts/bench_long_chain.py [--lengths 4096,8192,16384,32768] [--max-tokens 2048] [--model DIR]

A chain of U tokens (one call: a short prompt, then a response of U tokens, every response token a
target) runs in chunks of ``--max-tokens`` against its cached prefix. Without checkpointing every
chunk's activations are held for the one backward; with ``checkpoint_chunks`` each chunk keeps only
its keys/values (all layers) and the hidden states at its predicting positions, and recomputes the rest
in the backward. Reported per U: peak heap growth (glibc mallinfo2, memorywalker.bench.memory) of each,
the seconds, and the slope between the two longest chains in bytes per token, beside the K/V bytes per
token the model implies (2 · layers · kv_heads · head_dim · dtype size) and the hidden state's.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def chain(model, n: int, vocab: int):
    from memorywalker.engine import Batch, TokenCall

    g = torch.Generator().manual_seed(n)
    ids = torch.randint(10, vocab, (n + 16,), generator=g).tolist()
    return Batch.from_token_ids([[TokenCall(ids, 16)]])


def main() -> None:
    from memorywalker.bench.memory import PeakMemory
    from memorywalker.engine import EngineConfig, run
    from memorywalker.modelkit import default_kit

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,8192,16384,32768")
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model or default_kit()[1], dtype=torch.float32)
    model.train()
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_bytes = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        batch = chain(model, n, c.vocab_size)
        row = {"tokens": n + 16, "targets": len(batch.targets)}
        for ckpt in (False, True):
            cfg = EngineConfig(method="radix", max_tokens=args.max_tokens, checkpoint_chunks=ckpt)
            model.zero_grad(set_to_none=True)
            with PeakMemory(torch.device("cpu")) as mem:
                t0 = time.perf_counter()
                run(model, batch, cfg)
                dt = time.perf_counter() - t0
            key = "checkpointed" if ckpt else "plain"
            row[f"{key}_peak_mib"], row[f"{key}_s"] = round(mem.peak_mib, 1), round(dt, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    a, b = rows[-2], rows[-1]
    du = b["tokens"] - a["tokens"]
    out = {"model": {"layers": c.num_hidden_layers, "kv_heads": c.num_key_value_heads, "head_dim": head_dim,
                     "hidden": c.hidden_size, "vocab": c.vocab_size},
           "max_tokens": args.max_tokens, "threads": torch.get_num_threads(), "rows": rows,
           "slope_bytes_per_token": {k: round((b[f"{k}_peak_mib"] - a[f"{k}_peak_mib"]) * 2**20 / du)
                                     for k in ("plain", "checkpointed")},
           "kv_bytes_per_token": kv_bytes, "hidden_bytes_per_token": c.hidden_size * 4}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
