"""The start every recipe shares (train/recipe.py): sft, rl and dpo all set up their ranks with the
configured collective timeout (dpo used to pass none) and check the run dir on every rank first."""

from __future__ import annotations

import pytest

import memorywalker.train.recipe as recipe
from memorywalker.recipes.dpo import DPOConfig
from memorywalker.recipes.dpo import train as dpo_train
from memorywalker.recipes.rl import RLConfig
from memorywalker.recipes.rl import train as rl_train
from memorywalker.recipes.sft import SFTConfig
from memorywalker.recipes.sft import train as sft_train


class Started(Exception):
    pass


@pytest.mark.parametrize("cls, train", [(SFTConfig, sft_train), (RLConfig, rl_train), (DPOConfig, dpo_train)])
def test_every_recipe_starts_its_ranks_with_the_configured_collective_timeout(cls, train, tmp_path, monkeypatch):
    seen = []

    def init_distributed(timeout_s=None):
        seen.append(timeout_s)
        raise Started

    monkeypatch.setattr(recipe, "init_distributed", init_distributed)
    data = {} if cls is RLConfig else {"data": "x.jsonl"}
    with pytest.raises(Started):
        train(cls(run_dir=str(tmp_path / "run"), collective_timeout=123.0, **data), progress=False)
    assert seen == [123.0]
