"""The records a model is fed, checked before the model loads: vocabulary, length, structure.

Every recipe (and every command that runs forwards on recorded data) reads its trajectories through
:func:`read_records`: the tokenizer is loaded first, so a recorded token id the tokenizer does not have
is rejected (``token_out_of_vocab``) instead of crashing the embedding lookup, and :class:`FitsModel`
renders each trajectory and rejects it (``too_long``) when one of its calls is longer than the model's
positions, before any forward. Rejected records go to the run's rejects file with their reason; the
others train; counts add up.

    >>> FitsModel(renderer=None, max_positions=None).max_positions is None   # no limit known: no check
    True
"""

from __future__ import annotations

import json
from pathlib import Path

from memorywalker.errors import InputError
from memorywalker.records.io import TrajectoryReader
from memorywalker.records.schema import Trajectory
from memorywalker.records.validate import RecordError

# config.json keys that hold a causal LM's number of positions, by architecture family.
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_positions(model: str | Path) -> int | None:
    """The number of positions of a local model dir (its ``config.json``), of an adapter dir's base
    model, or of ``kit``; None when it cannot be read (the model load reports why, later)."""
    from memorywalker.train.model import resolve_dirs  # lazy: train.model loads torch; the readers need none

    model_dir, _ = resolve_dirs(str(model))
    try:
        adapter = model_dir / "adapter_config.json"
        if adapter.is_file():
            base = json.loads(adapter.read_text()).get("base_model_name_or_path")
            return model_positions(base) if base else None
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)  # multimodal wrappers keep the LM's config inside
    return next((int(config[k]) for k in _POSITION_KEYS if isinstance(config.get(k), int)), None)


class FitsModel:
    """A :class:`~memorywalker.records.io.TrajectoryReader` check: render each trajectory and reject it
    as ``too_long`` when a call's sequence ``S_t`` (its position ids run 0 … len − 1 under every exact
    method) is longer than ``max_positions``. Accepted renderings are kept in ``rendered`` by id."""

    def __init__(self, renderer, max_positions: int | None, *, full_view: bool = False, keep: bool = True):
        self.renderer, self.max_positions, self.full_view, self.keep = renderer, max_positions, full_view, keep
        self.rendered: dict[str, object] = {}

    def __call__(self, traj: Trajectory) -> None:
        r = self.renderer.render(traj, full_view=self.full_view)
        if self.max_positions is not None:
            longest = max(r.calls, key=lambda c: len(c.tokens), default=None)
            if longest is not None and len(longest.tokens) > self.max_positions:
                raise RecordError("too_long", f"call {longest.call_id!r} renders to {len(longest.tokens):,} tokens; "
                                  f"the model has {self.max_positions:,} positions (max_seq_len)")
        if self.keep:
            self.rendered[traj.id] = r


def read_records(recipe: str, data: str | Path | None, trajectories: list[Trajectory] | None, *, tokenizer,
                 rejects_path: Path, check=None, verbose: bool = True) -> list[Trajectory]:
    """The accepted trajectories of ``data`` (or of ``trajectories`` given in memory, checked the same
    way), with ids checked against ``tokenizer``'s vocabulary and ``check`` applied; rejects go to
    ``rejects_path``. Raises ``InputError`` when none is accepted."""
    kwargs = dict(rejects_path=rejects_path, vocab_size=len(tokenizer), check=check)
    reader = TrajectoryReader(data, **kwargs) if trajectories is None else TrajectoryReader.of(trajectories, **kwargs)
    out = list(reader)
    where = data if trajectories is None else "(trajectories given to train())"
    if not out:
        raise InputError(f"data {where}: no valid trajectory ({reader.summary}"
                         f"{'; reasons in ' + str(rejects_path) if reader.summary.rejected else ''})")
    if verbose and reader.summary.rejected:
        print(f"{recipe}: {reader.summary}; reasons in {rejects_path}")
    return out
