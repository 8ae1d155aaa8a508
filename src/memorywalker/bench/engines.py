"""Cost and exactness of every training method on one micro-batch (``memorywalker bench engines``).

For each method one micro-batch (synthetic trees, GRPO forests, or imported trajectories, each its own
tree) is run forward + backward ``repeats`` times after ``warmup`` untimed runs. Exactness is measured
against an independent reference: :func:`plain_per_call_logprobs`, a plain forward of the model's own
decoder over each call's ``S_t`` (default positions, its own causal attention, its own head), with no
engine code. The ``plain-causal`` row is the physical limit for U tokens: the unique tokens as one
ordinary causal sequence, one forward/backward with the LM head at as many positions as the batch has
targets, a chunk at a time (:func:`memorywalker.engine.head.target_logprobs`, the engine's head), so
the ratio compares attention schedules, not LM-head strategies.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from memorywalker.bench.memory import PeakMemory
from memorywalker.bench.shapes import OVERRIDES, random_model
from memorywalker.engine import EngineConfig, get_method, needs_full_view, run
from memorywalker.engine.head import OutputHead, capture_hidden, target_logprobs
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
from memorywalker.errors import InputError
from memorywalker.layout import Batch
from memorywalker.modelkit import default_kit
from memorywalker.modelkit.pretrained import model_path
from memorywalker.records import TrajectoryReader
from memorywalker.render import Renderer

REFERENCE_CHUNK = 512  # target positions per head call in the reference


def _first_calls(traj, n: int | None):
    """``traj`` cut to its first ``n`` calls (evictions before a dropped call go with it)."""
    if n is None or n >= len(traj.calls):
        return traj
    kept = {c.id for c in traj.calls[:n]}
    return traj.model_copy(update={"calls": traj.calls[:n],
                                   "evictions": [e for e in traj.evictions if e.before_call in kept]})


def _only_calls(rt, keep: set[int]):
    """A rendered trajectory whose calls outside ``keep`` have no targets (the tree stays the same)."""
    calls = [c if c.index in keep else replace(c, targets=[], target_logprobs=[], selected=False) for c in rt.calls]
    return replace(rt, calls=calls)


def plain_per_call_logprobs(model, rendered, calls: dict[str, set[int]]) -> dict[tuple[str, int, int], float]:
    """Independent reference: for each chosen call, one plain forward of the model's decoder over
    ``S_t`` (its own causal attention and default positions, no memorywalker buffer, mask, label or
    head code), its output embeddings applied at the target positions ``REFERENCE_CHUNK`` at a time, and
    log p(S_t[i] | S_t[:i]) = log_softmax(logits[i − 1])[S_t[i]]. Keys: (trajectory id, call index,
    target position in S_t). For models whose head output is used as is (no soft-capping or scale)."""
    device = next(model.parameters()).device
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    out = {}
    with torch.no_grad():
        for rt in rendered:
            for rc in rt.calls:
                if rc.index not in calls.get(rt.id, ()) or not rc.targets:
                    continue
                ids = torch.tensor([rc.tokens], device=device)
                hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
                for s in range(0, len(rc.targets), REFERENCE_CHUNK):
                    targets = rc.targets[s:s + REFERENCE_CHUNK]
                    rows = torch.tensor(targets, device=device) - 1
                    logp = torch.log_softmax(head(hidden[rows]).float(), -1)
                    for j, i in enumerate(targets):
                        out[(rt.id, rc.index, i)] = float(logp[j, rc.tokens[i]])
    return out


def load_bench_model(*, model_dir: Path | None, shape: str | None, arch: str, overrides: dict, dtype, seed: int):
    """(model, tokenizer dir): an HF model dir, or a random model of a shipped shape / the kit's, with
    ``overrides`` (vocab_size, hidden_size, ...) applied. Nothing is downloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: ~3 s, only past the CLI's checks

    fields = {OVERRIDES[k]: v for k, v in overrides.items() if v is not None}
    if model_dir is not None:
        if shape or fields:
            raise InputError("--model takes the model as it is: no --shape or shape flags with it")
        model_dir = model_path(str(model_dir))  # a packaged model's name (smollm2-135m) is its converted dir
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype), model_dir
    tok_dir, kit_model = default_kit(arch=arch)
    if shape is None and not fields:
        return AutoModelForCausalLM.from_pretrained(kit_model, dtype=dtype), tok_dir
    tok = AutoTokenizer.from_pretrained(tok_dir)
    return random_model(shape or "kit", tok, dtype=dtype, seed=seed, kit_model_dir=kit_model, **fields), tok_dir


def run_bench(*, turns: int, evictions: int, words: int, retries: int, trajectories: int, group_size: int,
              repeats: int, methods: list[str], model_dir: Path | None, arch: str, attention: str,
              max_tokens: int, dtype: str, device: str, seed: int, data: Path | None = None,
              tokenizer_dir: Path | None = None, max_calls: int | None = None, sample_calls: int | None = None,
              plain_causal: bool = True, warmup: int = 1, shape: str | None = None, overrides: dict | None = None,
              checkpoint_chunks: bool = False) -> dict:
    from transformers import AutoTokenizer  # lazy: transformers (~3 s) only past the CLI's argument checks

    overrides = overrides or {}
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model, tok_dir = load_bench_model(model_dir=model_dir, shape=shape, arch=arch, overrides=overrides,
                                      dtype=torch_dtype, seed=seed)
    model = model.to(dev)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir or tok_dir)
    renderer = Renderer(tok)
    full_view = needs_full_view(methods)

    if data is not None:
        trajs = [_first_calls(t, max_calls) for t in TrajectoryReader(data, vocab_size=len(tok))]
        if not trajs:
            raise InputError(f"{data}: no valid trajectory")
        groups = [[renderer.render(t, full_view=full_view)] for t in trajs]
    else:
        groups = []
        for i in range(trajectories):
            spec = SyntheticSpec(turns=turns, evictions=evictions, words=words, retries=retries, seed=seed + i)
            ts = (synthetic_group(spec, f"bench-{i}", group_size) if group_size > 1
                  else [synthetic_trajectory(spec, f"bench-{i}")])
            groups.append([renderer.render(t, full_view=full_view) for t in ts])
    result = bench_groups(model, groups, methods=methods, attention=attention, max_tokens=max_tokens,
                          repeats=repeats, warmup=warmup, seed=seed, sample_calls=sample_calls,
                          plain_causal=plain_causal, checkpoint_chunks=checkpoint_chunks)
    return {
        "config": dict(turns=turns, evictions=evictions, words=words, retries=retries, trajectories=trajectories,
                       group_size=group_size, repeats=repeats, warmup=warmup, attention=attention, max_tokens=max_tokens,
                       dtype=dtype, seed=seed, data=None if data is None else str(data), max_calls=max_calls,
                       sample_calls=sample_calls, shape=shape, overrides=overrides,
                       checkpoint_chunks=checkpoint_chunks),
        "device": result.pop("device"),
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "model": str(model_dir) if model_dir else f"random {shape or 'kit'}",
        "model_shape": model_shape(model),
        **result,
    }


def model_shape(model) -> dict:
    """The fields of ``model``'s config a benchmark row is read against."""
    config = model.config
    return {"model_type": config.model_type, "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
            "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            "parameters": sum(p.numel() for p in model.parameters())}


def bench_groups(model, groups, *, methods: list[str], attention: str | None, max_tokens: int, repeats: int,
                 warmup: int, seed: int, sample_calls: int | None = None, plain_causal: bool = True,
                 checkpoint_chunks: bool = False, skip=None) -> dict:
    """Time and check every method on the micro-batch of rendered ``groups`` (lists of rendered
    trajectories, each list one tree), on ``model``'s device and dtype. ``skip(method, rows)``, when
    given, is asked before each method (``plain-causal`` included) with the rows so far; a string it
    returns is the reason the method is not run (a row ``{method, skipped}``). A method that runs out of
    CUDA memory gets ``skipped: "out of memory"``. Returns the result's keys from ``device`` on."""
    dev = next(model.parameters()).device
    model.train()
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
            model.zero_grad(set_to_none=True)
            fn()
        times, peak = [], 0.0
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            with PeakMemory(dev) as mem:
                if dev.type == "cuda":  # CUDA events: the stream's time, not the host's launch queue
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = fn()
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end) / 1000)
                else:
                    t0 = time.perf_counter()
                    out = fn()
                    times.append(time.perf_counter() - t0)
            peak = max(peak, mem.peak_mib)
        return out, times, peak, mem.kind

    def guarded(method, fn):
        """``fn()``'s row, or a skipped row (the caller's reason, or CUDA out of memory)."""
        reason = skip(method, rows) if skip is not None else None
        if reason is None:
            try:
                return fn()
            except torch.OutOfMemoryError:
                model.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                reason = "out of memory"
        return {"method": method, "skipped": reason}

    rows: list[dict] = []
    sampled = len(chosen) < len(with_targets)
    for method in methods:
        cfg = EngineConfig(method=method, attention=attention, max_tokens=max_tokens,
                           checkpoint_chunks=checkpoint_chunks)
        mb = batch
        if method == "per-call" and sampled:  # only the sampled calls carry targets: one forward each
            mb = Batch.from_groups([[_only_calls(rt, ref_calls.get(rt.id, set())) for rt in g] for g in groups])

        def measure(method=method, cfg=cfg, mb=mb):
            res, times, peak, kind = timed(lambda: run(model, mb, cfg))
            scale = len(with_targets) / len(chosen) if mb is not batch else 1.0
            lp = res.logprobs.float().cpu().numpy()
            diffs = [abs(lp[i] - reference[k]) for i, k in enumerate(keys_of(mb)) if k in reference and np.isfinite(lp[i])]
            row = _row(method, get_method(method).exactness, res.metrics["forwards"], res.metrics["backwards"],
                       res.metrics["processed_tokens"], n_trees, [t * scale for t in times], peak, kind,
                       float(max(diffs)) if diffs else None, int(res.metrics["lost_targets"]))
            row["extrapolated"] = scale != 1.0
            if scale != 1.0:
                row["forwards"] = round(row["forwards"] * scale)
                row["backwards"] = round(row["backwards"] * scale)
                row["tokens"] = per_call_tokens
                row["tokens_per_tree"] = per_call_tokens / n_trees
            return row

        rows.append(guarded(method, measure))

    if plain_causal:
        # The U unique tokens as one sequence, one causal forward/backward, no mask (the is_causal kernel);
        # the head at as many positions as the batch has targets, a chunk at a time like the engine's.
        seq = np.concatenate([t.token_ids for t in batch.trees])
        ids = torch.from_numpy(seq)[None].to(dev)
        n_targets = min(len(batch.targets), len(seq) - 1)
        preds = torch.from_numpy(np.sort(np.random.default_rng(seed).choice(len(seq) - 1, n_targets, replace=False)))
        head = OutputHead.of(model)

        def causal():
            with capture_hidden(model, head) as cap:
                model(input_ids=ids, use_cache=False, logits_to_keep=preds.to(dev))
            logprob = target_logprobs(head, cap.hidden[0], ids[0, preds.to(dev) + 1])
            loss = -logprob.mean()
            loss.backward()
            return loss

        def measure_causal():
            _, times, peak, kind = timed(causal)
            return {**_row("plain-causal", "limit", 1, 1, unique, n_trees, times, peak, kind, None, 0),
                    "extrapolated": False}

        rows.append(guarded("plain-causal", measure_causal))
    return {
        "device": str(dev) if dev.type == "cpu" else torch.cuda.get_device_name(dev),
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
