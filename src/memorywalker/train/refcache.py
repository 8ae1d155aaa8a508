"""Reference log-probability cache: the reference model's scored-token logprob sums, computed once.

DPO compares the policy with a frozen reference on every pair side. The reference's sums never change
during a run, so they are computed once (before training, by any exact method) and stored in a JSON
file keyed by everything that determines them:

* the reference weights (a SHA-256 over every tensor's name, dtype, shape and bytes) and the adapter
  configuration applied to them, if any;
* the tokenizer (its serialized vocabulary/merges and special tokens) and the chat template;
* the side's exact token sequences ``S_t`` and the selected (scored) indices in each;
* the conditioning settings: method, attention backend, position ids, ``max_tokens``, the truncation
  rule, and the dtype.

Any change to one of them gives another key: the cache misses and the sum is recomputed.

>>> key = side_key({"weights": "ab"}, [([1, 2, 3], [2])])
>>> key == side_key({"weights": "ab"}, [([1, 2, 3], [2])]), key == side_key({"weights": "ab"}, [([1, 2, 4], [2])])
(True, False)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memorywalker.engine import run
from memorywalker.layout import Batch
from memorywalker.tree.pairs import scored_targets


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weights_hash(model: torch.nn.Module) -> str:
    """SHA-256 over the model's state dict: every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tokenizer_hash(tokenizer) -> str:
    """SHA-256 of the tokenizer's serialization (vocabulary, merges, normalizer…) and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    return _sha((text + "\n" + special).encode())


def template_hash(tokenizer) -> str:
    """SHA-256 of the chat template text (empty string when the tokenizer has none)."""
    return _sha((getattr(tokenizer, "chat_template", None) or "").encode())


def ref_settings(model, tokenizer, *, method: str, attention: str | None, max_tokens: int, truncated: str,
                 adapter: dict | None = None) -> dict[str, Any]:
    """Everything besides the sequences that a reference logprob depends on (the cache key's first half)."""
    return {
        "weights": weights_hash(model),
        "adapter": adapter,
        "tokenizer": tokenizer_hash(tokenizer),
        "template": template_hash(tokenizer),
        "method": method,
        "attention": attention,
        "positions": "depth",  # position id = index inside S_t (DESIGN.md)
        "max_tokens": max_tokens,
        "truncated": truncated,
        "dtype": str(next(model.parameters()).dtype),
    }


def side_key(settings: dict[str, Any], calls: list[tuple[list[int], list[int]]]) -> str:
    """Key of one pair side: ``settings`` and, per call with scored targets, ``(S_t tokens, scored indices)``."""
    text = json.dumps({"settings": settings, "calls": [[list(map(int, t)), list(map(int, s))] for t, s in calls]},
                      sort_keys=True, separators=(",", ":"))
    return _sha(text.encode())


def pair_side_calls(pair, side: int) -> list[tuple[list[int], list[int]]]:
    """``(S_t tokens, scored indices)`` of each scored call of one side of an admitted pair."""
    rt = pair.chosen if side == 0 else pair.rejected
    scored = pair.scored_of(side)
    return [(rc.tokens, scored[rc.index]) for rc in rt.calls if rc.index in scored]


class RefCache:
    """``{key: [logprob_sum, scored_tokens]}`` in a JSON file (``path=None``: in memory only)."""

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.entries: dict[str, list[float]] = {}
        self.hits = self.misses = 0
        if self.path is not None and self.path.exists():
            self.entries = json.loads(self.path.read_text())

    def get(self, key: str) -> list[float] | None:
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: str, value: list[float]) -> None:
        self.entries[key] = [float(v) for v in value]

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)


def reference_sums(model, pairs: list, settings: dict[str, Any], cache: RefCache, engine_cfg, *,
                   batch_pairs: int = 8) -> torch.Tensor:
    """float64 [P, 2] reference logprob sums (chosen, rejected) of each pair's scored targets: from the
    cache, else by the engine (``engine_cfg``: an exact method, no backward) on ``model``."""
    out = torch.zeros(len(pairs), 2, dtype=torch.float64)
    keys = [[side_key(settings, pair_side_calls(p, s)) for s in (0, 1)] for p in pairs]
    todo = []
    for i, ks in enumerate(keys):
        found = [cache.get(k) for k in ks]
        if all(f is not None for f in found):
            out[i] = torch.tensor([f[0] for f in found], dtype=torch.float64)
        else:
            todo.append(i)
    for start in range(0, len(todo), batch_pairs):
        idx = todo[start:start + batch_pairs]
        chunk = [pairs[i] for i in idx]
        batch = Batch.from_groups([[p.chosen, p.rejected] for p in chunk])
        scored, seq = scored_targets(batch, chunk)
        res = run(model, batch, engine_cfg, backward=False)
        lp = res.logprobs.detach().double().cpu().numpy()
        sums = np.zeros(2 * len(chunk))
        counts = np.zeros(2 * len(chunk))
        np.add.at(sums, seq[scored], lp[scored])
        np.add.at(counts, seq[scored], 1)
        for j, i in enumerate(idx):
            for s in (0, 1):
                cache.put(keys[i][s], [sums[2 * j + s], counts[2 * j + s]])
            out[i] = torch.tensor(sums[2 * j:2 * j + 2])
    cache.save()
    return out
