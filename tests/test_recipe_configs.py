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
    with pytest.raises(ConfigError, match="unknown harness 'zip'"):  # the compression policy's registry
        load_config(RLConfig, None, ["compressor=zip"])
    with pytest.raises(ConfigError, match="unknown parallel 'tp'; valid: ddp, fsdp"):  # train.config.PARALLEL
        load_config(SFTConfig, None, ["parallel=tp"])
    assert load_config(RLConfig, None, ["method=sdcc", "budget=900"]).budget == 900


def test_rl_harness_names_a_real_harness_with_tasks_and_the_compressor_without(tmp_path):
    """``harness=`` named the compressor before real harnesses ran: without ``tasks`` it still does (a
    deprecation line says to write ``compressor=``); with ``tasks`` it names the real harness."""
    with pytest.warns(DeprecationWarning, match="write compressor=opencode"):
        cfg = load_config(RLConfig, None, ["harness=opencode"])
    assert (cfg.compressor, cfg.harness, cfg.tasks) == ("opencode", None, None)
    cfg = load_config(RLConfig, None, ["tasks=t.jsonl", "harness=opencode", "model=runs/x/final"])
    assert (cfg.compressor, cfg.harness, cfg.served_name) == ("claude-code", "opencode", "final")
    assert load_config(RLConfig, None, ["tasks=t.jsonl", "harness=cmd:python agent.py"]).harness == "cmd:python agent.py"
    with pytest.raises(ConfigError, match="tasks= needs harness= one of claude-code, codex, opencode or cmd:COMMAND"):
        load_config(RLConfig, None, ["tasks=t.jsonl", "harness=zip"])
    with pytest.raises(ConfigError, match="tasks= needs harness="):
        load_config(RLConfig, None, ["tasks=t.jsonl"])
    with pytest.raises(ConfigError, match="harness=codex needs tasks=FILE"):
        load_config(RLConfig, None, ["harness=codex", "compressor=none"])
    with pytest.raises(ConfigError, match="script= scores the scripted responses"):
        load_config(RLConfig, None, ["tasks=t.jsonl", "harness=codex", "script=s.yaml", "rollout_engine=vllm"])



def test_rl_max_turns_is_now_max_steps_and_a_run_recorded_with_it_resumes(tmp_path):
    """RL's act calls per episode were ``max_turns``; HarnessConfig and every command call them
    ``max_steps``. The old key still loads (a deprecation line names the new one; both at once are an
    error), and a run dir whose config.json holds ``max_turns`` resumes under ``max_steps`` — refused
    only when the value changed."""
    import json

    from memorywalker.train.rundir import check_run_dir

    with pytest.warns(DeprecationWarning, match="max_turns= is now max_steps=: write max_steps=3"):
        cfg = load_config(RLConfig, None, ["max_turns=3"])
    assert cfg.max_steps == 3 and "max_turns" not in cfg.model_dump()
    with pytest.warns(DeprecationWarning, match="max_turns= is now max_steps="):
        assert RLConfig(max_turns=5).max_steps == 5
    with pytest.raises(ConfigError, match="max_turns= is now max_steps=: give max_steps= only"):
        load_config(RLConfig, None, ["max_turns=3", "max_steps=4"])
    run = tmp_path / "run"
    run.mkdir()
    recorded = RLConfig(run_dir=str(run), max_steps=3).model_dump(mode="json")
    recorded["max_turns"] = recorded.pop("max_steps")  # as a run before the rename wrote it
    (run / "config.json").write_text(json.dumps(recorded))
    check_run_dir(RLConfig(run_dir=str(run), max_steps=3, resume=True))  # the same run: resumes
    with pytest.raises(ConfigError, match=r"max_steps: 3 -> 4"):
        check_run_dir(RLConfig(run_dir=str(run), max_steps=4, resume=True))

def test_engine_config_carries_every_engine_field_a_recipe_config_has():
    """Each engine setting is typed once (EngineConfig) and a recipe config's value reaches the engine:
    RL's clipping, rollout correction and temperature too (rl.py used to list them by hand)."""
    import dataclasses

    from memorywalker.engine.config import EngineConfig

    given = {"method": "dfs", "normalization": "call", "max_tokens": 1234, "clip_low": 0.1, "clip_high": 0.3,
             "tis_cap": 3.0, "rollout_is_threshold": 4.0, "rollout_rs": "token", "rollout_rs_threshold": (0.25, 4.0),
             "grpo_scale_by_std": False, "temperature": 0.7, "sdcc_lambda": 0.5, "sdcc_students": "all",
             "sdcc_compressed_main": True, "checkpoint_chunks": True}
    engine = RLConfig(**given).engine_config("grpo")
    assert engine.objective == "grpo" and {k: getattr(engine, k) for k in given} == given
    shared = {f.name for f in dataclasses.fields(EngineConfig)} & set(RLConfig.model_fields)
    assert shared == set(given) | {"attention", "rollout_is"}  # all but these two set to a non-default above
