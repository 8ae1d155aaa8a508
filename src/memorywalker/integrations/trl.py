"""Exact training on compacted sessions inside TRL: a dataset of trajectory records, a collator that
builds conditioning trees, and a small ``SFTTrainer`` subclass whose loss is the engine's.

    from trl import SFTConfig
    from memorywalker.engine import EngineConfig
    from memorywalker.integrations.trl import ExactSFTTrainer, TreeCollator, records_dataset, trl_args

    dataset = records_dataset("sessions.jsonl", tokenizer)          # one row per trajectory record
    trainer = ExactSFTTrainer(
        model=model, processing_class=tokenizer, train_dataset=dataset,
        args=trl_args(SFTConfig, output_dir="out", per_device_train_batch_size=8, max_steps=100),
        data_collator=TreeCollator(tokenizer, method="radix"),
        engine=EngineConfig(method="radix"),
    )
    trainer.train()

What changes against a plain ``SFTTrainer``: the dataset is not tokenized by TRL (each row is a whole
record, ``skip_prepare_dataset``; :func:`trl_args` sets it and keeps the ``record`` column), the
collator renders each record with the chat template and merges its calls into a ConditioningTree
(``Batch``), and ``compute_loss`` is :func:`memorywalker.engine.loss`: every response conditioned on
the context it was delivered with, normalized over the whole optimizer step (the step's micro-batches
are counted together in :meth:`ExactSFTTrainer.get_batch_samples`, as the memorywalker recipes do).
The optimizer, schedule, logging, checkpoints, PEFT and accelerate are TRL's and transformers'.

A pairwise (DPO-style) loss plugs in the same way: ``loss_fn=dpo_loss_fn(ref_model, beta=0.1)`` with
:class:`PairCollator` over rows ``{"chosen": record, "rejected": record}``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from memorywalker.engine import (
    Batch,
    Denominators,
    EngineConfig,
    LossOutput,
    get_method,
    loss,
    step_denominators,
)
from memorywalker.errors import InputError
from memorywalker.recipes.dpo import DPOConfig, pair_loss, pair_sums
from memorywalker.records.io import TrajectoryReader
from memorywalker.records.schema import Trajectory
from memorywalker.render import Renderer
from memorywalker.tree.pairs import admit_pair

RECORD = "record"  # the dataset column holding one trajectory record (JSON)


def records_dataset(data: str | Path | Sequence[Trajectory], tokenizer, *, rejects: str | Path | None = None):
    """A ``datasets.Dataset`` with one row per valid trajectory record (column ``record``: its JSON).

    Records are validated against ``tokenizer``'s vocabulary as every memorywalker reader does; the
    rejected ones (with their reasons) go to ``rejects``."""
    from datasets import Dataset  # lazy: optional dependency (datasets, with trl)

    kwargs = dict(rejects_path=rejects, vocab_size=len(tokenizer))
    reader = TrajectoryReader(data, **kwargs) if isinstance(data, str | Path) else TrajectoryReader.of(list(data), **kwargs)
    rows = [json.dumps(t.to_json_dict()) for t in reader]
    if not rows:
        raise InputError(f"{data}: no valid trajectory ({reader.summary})")
    return Dataset.from_dict({RECORD: rows})


def pairs_dataset(pairs: Sequence[tuple[Trajectory, Trajectory]]):
    """A ``datasets.Dataset`` of preference pairs: columns ``chosen`` and ``rejected`` (record JSON)."""
    from datasets import Dataset  # lazy: optional dependency (datasets, with trl)

    return Dataset.from_dict({"chosen": [json.dumps(w.to_json_dict()) for w, _ in pairs],
                              "rejected": [json.dumps(lo.to_json_dict()) for _, lo in pairs]})


def trl_args(config_cls, **kwargs):
    """``config_cls(**kwargs)`` (TRL's ``SFTConfig``) with what the tree collator needs: the dataset is
    not tokenized by TRL and its record column is kept. TRL turns on gradient checkpointing by default;
    here it is off unless asked for: the engine's radix forwards run under their own attention kernel,
    which transformers' layer checkpointing would not replay in the backward (use
    ``EngineConfig(checkpoint_chunks=True)`` for the same memory saving)."""
    kwargs.setdefault("remove_unused_columns", False)
    kwargs.setdefault("dataset_kwargs", {"skip_prepare_dataset": True})
    kwargs.setdefault("gradient_checkpointing", False)
    return config_cls(**kwargs)


def _record(value) -> Trajectory:
    return Trajectory.model_validate(json.loads(value) if isinstance(value, str) else value)


class TreeCollator:
    """Rows of :func:`records_dataset` -> ``{"mw_batch": Batch}``: each record rendered (the tokenizer's
    chat template, verified) and made one conditioning tree (``full_view`` for methods that train on it)."""

    def __init__(self, tokenizer, *, method: str = "radix", renderer: Renderer | None = None):
        self.renderer = renderer or Renderer(tokenizer)
        self.full_view = get_method(method).full_view

    def __call__(self, rows: list[dict]) -> dict:
        rendered = [self.renderer.render(_record(r[RECORD]), full_view=self.full_view) for r in rows]
        return {"mw_batch": Batch.from_groups([[rt] for rt in rendered])}


class PairCollator:
    """Rows ``{"chosen", "rejected"}`` -> ``{"mw_pairs": [AdmittedPair]}``: each pair admitted only when both
    records branch from one conditioning context (:func:`memorywalker.tree.pairs.admit_pair`; raises
    with the reason otherwise), scoring the divergent spans (``scored="divergent"``) or every target."""

    def __init__(self, tokenizer, *, scored: str = "divergent", renderer: Renderer | None = None):
        self.renderer = renderer or Renderer(tokenizer)
        self.scored = scored

    def __call__(self, rows: list[dict]) -> dict:
        return {"mw_pairs": [admit_pair(self.renderer.render(_record(r["chosen"])),
                                        self.renderer.render(_record(r["rejected"])), self.scored) for r in rows]}


def sft_loss_fn(model, inputs: dict, engine: EngineConfig, denominators: Denominators | None) -> LossOutput:
    """The engine's objective (``engine.objective``, NLL for SFT) over the exact tree logprobs."""
    return loss(model, inputs["mw_batch"], engine, denominators=denominators)


def dpo_loss_fn(ref_model, *, beta: float = 0.1, length_normalize: bool = False, sft_weight: float = 0.0) -> Callable:
    """A pairwise loss for :class:`ExactSFTTrainer` with :class:`PairCollator`: DPO on each pair's forest,
    the reference sums from ``ref_model`` (frozen; no gradient) on the same trees, averaged over the
    step's pairs (:func:`memorywalker.recipes.dpo.pair_loss`)."""
    cfg = DPOConfig(beta=beta, length_normalize=length_normalize, sft_weight=sft_weight)
    ref_model.eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)

    def fn(model, inputs: dict, engine: EngineConfig, denominators) -> LossOutput:
        pairs = inputs["mw_pairs"]
        num_pairs = torch.tensor(float(inputs.get("mw_step_pairs", len(pairs))))
        with torch.no_grad():
            ref = pair_sums(ref_model, pairs, engine)[0]
        total, stats = pair_loss(model, pairs, ref, engine, cfg, num_pairs)
        return LossOutput(total, None, stats)

    return fn


@functools.cache
def _trainer_class():
    from trl import SFTTrainer  # lazy: optional dependency (trl)

    class _ExactSFTTrainer(SFTTrainer):
        """``SFTTrainer`` whose loss is memorywalker's exact engine over conditioning trees.

        ``engine``: the method, objective and normalization (:class:`~memorywalker.engine.EngineConfig`;
        ``dp_size`` is set to the trainer's world size). ``loss_fn(model, inputs, engine, denominators)
        -> LossOutput``: :func:`sft_loss_fn` (default) or :func:`dpo_loss_fn`. The step's denominators
        are computed over all of its micro-batches before the first one runs, so gradient accumulation
        does not change the result (the trainer does not divide the loss again).
        """

        def __init__(self, *args, engine: EngineConfig | None = None, loss_fn: Callable = sft_loss_fn, **kwargs):
            super().__init__(*args, **kwargs)
            self.engine = dataclasses.replace(engine or EngineConfig(), dp_size=self.args.world_size)
            self.loss_fn = loss_fn
            self.last_output: LossOutput | None = None
            self._denominators: Denominators | None = None
            if not hasattr(self, "loss_is_scaled_for_ga") and self.args.gradient_accumulation_steps > 1:
                raise InputError("gradient accumulation with ExactSFTTrainer needs a transformers Trainer "
                                 "with loss_is_scaled_for_ga (transformers >= 5)")
            self.loss_is_scaled_for_ga = True  # the engine divides by the whole step's denominator

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            samples, n = super().get_batch_samples(epoch_iterator, num_batches, device)
            batches = [s["mw_batch"] for s in samples if "mw_batch" in s]
            self._denominators = step_denominators(batches, self.engine) if batches else None
            pairs = sum(len(s.get("mw_pairs", ())) for s in samples)
            for s in samples:  # a pairwise loss averages over the step's pairs
                if "mw_pairs" in s:
                    s["mw_step_pairs"] = pairs * self.args.world_size
            return samples, n

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = self.loss_fn(model, inputs, self.engine, self._denominators)
            self.last_output = out
            return (out.loss, out) if return_outputs else out.loss

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            with torch.no_grad():
                out = self.loss_fn(model, inputs, self.engine, None)
            return out.loss.detach(), None, None

    return _ExactSFTTrainer


def __getattr__(name: str):
    if name == "ExactSFTTrainer":  # TRL imported only when the trainer is used
        return _trainer_class()
    raise AttributeError(name)


def copy_reference(model):
    """A frozen copy of ``model`` to serve as the DPO reference (what TRL's DPOTrainer does without one)."""
    return copy.deepcopy(model)
