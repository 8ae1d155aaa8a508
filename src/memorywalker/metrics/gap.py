"""The train/rollout gap of each method on recorded rollouts (DESIGN.md, "Metrics").

For every target with a recorded rollout logprob, a method's trainer logprob is compared with it:
``logprob_abs_diff``, ``k3_kl``, ``chi2_token`` (per token) and ``log_ppl_abs_diff`` (per call), reported
overall and bucketed by the number of **branches** before the target's call (``0``, ``1``, ``2``,
``3+``): the call's segment index in the conditioning tree, i.e. how many times the history was
rewritten before it, whatever did it — a recorded eviction, a retry, a sample the next context
re-tokenizes, a template that drops earlier reasoning. The **floor** is the calls before any branch
(every call so far extends the previous one, so ``dfs`` conditions them as the rollout did and what
remains is numerical noise between the rollout engine and the trainer); **heavy** is 2 or more branches.
The same buckets counted in recorded evictions (white-box records only) are a second view,
``by_evictions``: a branch without a record lands in its ``0``. **Logit drift** is the mean total
variation between the method's next-token distribution and the deployment distribution (the
``per-call`` conditioning, i.e. the context the call really received), over full vocabularies.

>>> report = gap_report(model, renderer, trajectories, ["dfs", "radix"])   # doctest: +SKIP
>>> report["radix"]["overall"]["logprob_abs_diff"]                         # doctest: +SKIP
3.1e-07
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from tqdm import tqdm

from memorywalker.engine import EngineConfig, get_method, needs_full_view
from memorywalker.engine.forward import forward_layout, model_device
from memorywalker.engine.head import OutputHead, chunked_total_variation
from memorywalker.errors import InputError
from memorywalker.layout.batch import Batch
from memorywalker.objectives.metrics import gap_metrics
from memorywalker.records.schema import Trajectory
from memorywalker.render.render import Renderer
from memorywalker.render.types import calls_left_out

BUCKETS = ("0", "1", "2", "3+")
HEAVY = 2  # a target is heavy when at least this many branches preceded its call


def evictions_before_calls(traj: Trajectory) -> list[int]:
    """Per call, the number of evictions applied at or before it (white-box records).

    >>> from memorywalker.records import TrajectoryBuilder
    >>> b = TrajectoryBuilder("t"); s = b.message("system", "s")
    >>> for _ in range(3): _ = b.call([s], b.message("assistant", "a"))
    >>> b.eviction("call-1", "summarize", removed=[]); evictions_before_calls(b.build())
    [0, 1, 1]
    """
    index = {c.id: i for i, c in enumerate(traj.calls)}
    at = np.zeros(len(traj.calls) + 1, dtype=np.int64)
    for ev in traj.evictions:
        at[index[ev.before_call]] += 1
    return np.cumsum(at)[:-1].tolist()


def fmt_metric(x: float | None) -> str:
    """A metric for a table: ``-`` when absent, scientific below 1e-3 (the floor is ~1e-7), else 4 decimals.

    >>> fmt_metric(None), fmt_metric(8.1e-07), fmt_metric(0.85271), fmt_metric(0.0)
    ('-', '8.10e-07', '0.8527', '0.0000')
    """
    if x is None or x != x:  # None or NaN
        return "-"
    return f"{x:.2e}" if 0 < abs(x) < 1e-3 else f"{x:.4f}"


def in_bucket(count: torch.Tensor, bucket: str) -> torch.Tensor:
    """Mask of the ``count`` values that fall in ``bucket`` (one of :data:`BUCKETS`).

    >>> in_bucket(torch.tensor([0, 1, 3, 5]), "3+").tolist(), in_bucket(torch.tensor([0, 1, 3]), "1").tolist()
    ([False, False, True, True], [False, True, False])
    """
    return count >= 3 if bucket == "3+" else count == int(bucket)


@torch.no_grad()
def method_outputs(model, batch: Batch, method: str, *, with_hidden: bool, temperature: float = 1.0
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-target trainer logprobs [N] of the logits divided by ``temperature`` (NaN where the method
    lost a target) and, if asked, the hidden states at every target's predicting position [N, H] (NaN
    rows where lost): the head's input, whose distributions :func:`chunked_total_variation` compares a
    chunk at a time."""
    cfg = EngineConfig(method=method, temperature=temperature)
    m = get_method(method)
    layout = m.build_layout(batch, cfg)
    if with_hidden:  # hidden states at the target positions, through each buffer's KL channel
        layout = replace(layout, buffers=[replace(b, kl_row=np.arange(len(b.target_row)), kl_pred=b.target_pred)
                                          for b in layout.buffers if len(b.target_row)])
    device = model_device(model)
    n = len(batch.targets)
    logprobs = torch.full((n,), float("nan"), device=device)
    hidden = None
    for out in forward_layout(model, layout, torch.from_numpy(batch.targets.label), m, cfg.max_tokens,
                              temperature=temperature):
        if not len(out.buffer.target_row):
            continue  # e.g. sdcc's student buffers: the trainer's logprobs come from the full view
        rows = torch.from_numpy(out.buffer.target_row).to(device)
        logprobs[rows] = out.logprob
        if with_hidden:
            if hidden is None:
                hidden = out.kl_hidden.new_full((n, out.kl_hidden.shape[-1]), float("nan"))
            hidden[rows] = out.kl_hidden
    return logprobs, hidden


def _summarize(logp: torch.Tensor, rollout: torch.Tensor, call: torch.Tensor, tv: torch.Tensor | None,
               mask: torch.Tensor) -> dict[str, float | int | None]:
    ok = mask & torch.isfinite(logp) & torch.isfinite(rollout)
    out: dict[str, float | int | None] = {"targets": int(ok.sum())}
    if not ok.any():
        return {**out, "logprob_abs_diff": None, "k3_kl": None, "chi2_token": None, "log_ppl_abs_diff": None,
                "logit_drift": None}
    out.update({k: float(v) for k, v in gap_metrics(logp[ok], rollout[ok], call[ok]).items()})
    if tv is not None:
        t = tv[ok & torch.isfinite(tv)]
        out["logit_drift"] = float(t.mean()) if len(t) else None
    return out


def _nan_to_none(x: np.ndarray) -> list[float | None]:
    return [None if v != v else float(v) for v in x.tolist()]


def _per_call_rows(batch: Batch, tokens: dict | None, trajectory_id: str) -> dict | None:
    """The per-call offset/rollout columns of one single-tree batch, registered in ``tokens``."""
    if tokens is None:
        return None
    tg, tree = batch.targets, batch.trees[0]
    offset = tree.depth[tg.position]  # a target's index inside S_t is its depth in the tree
    out = tokens.setdefault(trajectory_id, {})
    for c in np.unique(tg.call):
        rows = tg.call == c
        out[batch.calls[c].call_id] = {"offset": offset[rows].tolist(),
                                       "rollout": _nan_to_none(tg.rollout_logprob[rows]), "logprob": {}}
    return out


def _fill_per_call(per_call: dict | None, batch: Batch, method: str, logp: torch.Tensor) -> None:
    if per_call is None:
        return
    lp = logp.numpy()
    for c in np.unique(batch.targets.call):
        per_call[batch.calls[c].call_id]["logprob"][method] = _nan_to_none(lp[batch.targets.call == c])


def sampling_temperature(traj: Trajectory) -> float:
    """The temperature whose distribution ``traj``'s rollout logprobs are of: the recorded sampling
    temperature of its policy; 1 for greedy decoding (untempered logprobs) and for logs that record none.

    >>> from memorywalker.records.schema import Trajectory
    >>> t = Trajectory.model_validate({"id": "t", "messages": [], "calls": [], "meta": {"policy": {"temperature": 0.7}}})
    >>> sampling_temperature(t), sampling_temperature(t.model_copy(update={"meta": {}}))
    (0.7, 1.0)
    """
    t = ((traj.meta or {}).get("policy") or {}).get("temperature")
    return float(t) if isinstance(t, int | float) and t > 0 else 1.0


AGAINST = ("recorded", "per-call")  # what gap_report compares the methods' logprobs with


def gap_report(model, renderer: Renderer, trajectories: Sequence[Trajectory], methods: Sequence[str], *,
               drift: bool = True, progress: bool = False, tokens: dict | None = None,
               against: str = "recorded", left_out: dict | None = None) -> dict:
    """Gap metrics of each method on ``trajectories`` (each its own tree), overall, by branches and by
    recorded evictions before the target's call.

    Returns ``{method: {"overall", "heavy", "floor", "by_branches": {"0", "1", "2", "3+"},
    "by_evictions": {"0", "1", "2", "3+"}}}`` (``floor`` = ``by_branches["0"]``, ``heavy`` = 2+
    branches), each a dict of ``targets``, ``logprob_abs_diff``, ``k3_kl``, ``chi2_token``,
    ``log_ppl_abs_diff``, ``logit_drift`` (None where there is nothing to compare).

    ``against="per-call"`` compares with the model's own ``per-call`` logprobs instead of the recorded
    rollout logprobs: each target conditioned on exactly the context its call received, what a rollout
    engine serving this model would have computed. It is the gap of imported sessions of another model
    (a Claude Code log has no logprobs of a model you can train); the exact methods' values there are
    the trainer's numerical floor, and every call is compared, recorded logprobs or not.

    Trainer logprobs are of the temperature each trajectory was sampled at (:func:`sampling_temperature`),
    the distribution its rollout logprobs are of.

    When ``tokens`` is a dict it is filled with the per-target values (what ``memorywalker view`` draws):
    ``tokens[trajectory_id][call_id] = {"offset": [index of the target in S_t], "rollout": [...],
    "logprob": {method: [...]}}``, None where a value is absent (a lost target, no recorded logprob).
    """
    if against not in AGAINST:
        raise InputError(f"against={against!r}; valid: {list(AGAINST)}")
    model.eval()
    head = OutputHead.of(model)
    full_view = needs_full_view(methods)
    rendered = [renderer.render(t, full_view=full_view) for t in trajectories]
    if left_out is not None:  # the calls that give no compared token, by reason
        left_out.update(calls_left_out(rendered, logprobs=against == "recorded"))
    per_method: dict[str, dict[str, list]] = {m: {"logp": [], "tv": []} for m in methods}
    rollout, call, branches, evictions = [], [], [], []
    call_base = 0
    it = range(len(rendered))
    if progress:
        it = tqdm(it, desc="gap", unit="traj")
    for i in it:
        batch = Batch.from_groups([[rendered[i]]])
        tg = batch.targets
        before = np.asarray(evictions_before_calls(trajectories[i]), dtype=np.int64)
        call_index = np.asarray([batch.calls[c].index for c in tg.call], dtype=np.int64)
        segment = np.asarray([batch.calls[c].segment for c in tg.call], dtype=np.int64)  # branches before it
        temperature = sampling_temperature(trajectories[i])
        ref_logp, ref_hidden = None, None
        if drift or against == "per-call":
            ref_logp, ref_hidden = method_outputs(model, batch, "per-call", with_hidden=drift, temperature=temperature)
        rollout.append(ref_logp.cpu() if against == "per-call" else torch.from_numpy(tg.rollout_logprob))
        call.append(torch.from_numpy(tg.call + call_base))
        branches.append(torch.from_numpy(segment))
        evictions.append(torch.from_numpy(before[call_index]))
        call_base += batch.num_calls
        per_call = _per_call_rows(batch, tokens, trajectories[i].id)
        for m in methods:
            lp, hid = method_outputs(model, batch, m, with_hidden=drift, temperature=temperature)
            per_method[m]["logp"].append(lp.cpu())
            _fill_per_call(per_call, batch, m, lp.cpu())
            if drift and hid is not None and ref_hidden is not None:
                tv = chunked_total_variation(head, hid, ref_hidden, temperature=temperature)
                per_method[m]["tv"].append(tv.cpu())
            elif drift:
                per_method[m]["tv"].append(torch.full((len(tg),), float("nan")))

    rollout_t = torch.cat(rollout) if rollout else torch.empty(0)
    call_t = torch.cat(call) if call else torch.empty(0, dtype=torch.long)
    k = torch.cat(branches) if branches else torch.empty(0, dtype=torch.long)
    e = torch.cat(evictions) if evictions else torch.empty(0, dtype=torch.long)
    report = {}
    for m in methods:
        logp = torch.cat(per_method[m]["logp"]) if per_method[m]["logp"] else torch.empty(0)
        tv = torch.cat(per_method[m]["tv"]) if drift and per_method[m]["tv"] else None
        report[m] = {
            "overall": _summarize(logp, rollout_t, call_t, tv, torch.ones_like(k, dtype=torch.bool)),
            "heavy": _summarize(logp, rollout_t, call_t, tv, k >= HEAVY),
            "floor": _summarize(logp, rollout_t, call_t, tv, k == 0),
            "by_branches": {b: _summarize(logp, rollout_t, call_t, tv, in_bucket(k, b)) for b in BUCKETS},
            "by_evictions": {b: _summarize(logp, rollout_t, call_t, tv, in_bucket(e, b)) for b in BUCKETS},
        }
    return report
