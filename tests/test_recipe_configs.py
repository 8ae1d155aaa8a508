"""Every shipped recipe config loads into its typed config, and its first line is the command using it."""

from __future__ import annotations

from pathlib import Path

import pytest

from memorywalker.recipes.dpo import DPOConfig
from memorywalker.recipes.rl import RLConfig
from memorywalker.recipes.sft import SFTConfig
from memorywalker.train.config import ConfigError, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))
CLASSES = {"sft": SFTConfig, "rl": RLConfig, "dpo": DPOConfig}


def test_configs_are_shipped():
    assert {p.name for p in CONFIGS} >= {"sft_tiny.toml", "rl_tiny.toml", "dpo_tiny.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_instantiates(path):
    recipe = path.name.split("_")[0]
    first = path.read_text().splitlines()[0]
    assert first.startswith(f"# memorywalker {recipe} --config configs/{path.name}"), first
    cfg = load_config(CLASSES[recipe], path)
    assert isinstance(cfg, CLASSES[recipe])


def test_unknown_keys_and_bad_values_fail_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown key 'batchsize'; valid keys: .*batch_size"):
        load_config(SFTConfig, None, ["batchsize=4"])
    with pytest.raises(ConfigError, match=r"unknown method 'tree'; valid: \['per-call', 'logit-tree', 'radix'"):
        load_config(RLConfig, None, ["method=tree"])
    with pytest.raises(ConfigError, match="unknown harness"):
        load_config(RLConfig, None, ["harness=zip"])
    with pytest.raises(ConfigError, match="unknown parallel 'tp'; valid: ddp, fsdp"):  # train.config.PARALLEL
        load_config(SFTConfig, None, ["parallel=tp"])
    assert load_config(RLConfig, None, ["method=sdcc", "budget=900"]).budget == 900
