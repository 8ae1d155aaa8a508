"""Recipe infrastructure: typed configs, atomic checkpoints, metrics logging."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from memorywalker.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from memorywalker.train.config import ConfigError, RecipeConfig, load_config
from memorywalker.train.logging import MetricsLogger


class Optim(BaseModel, extra="forbid"):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)


class Cfg(RecipeConfig):
    method: str = "tree-mask"
    steps: int = 10
    optim: Optim = Optim()


def test_config_file_and_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('# memorywalker sft --config c.toml\nsteps = 4\n[optim]\nlr = 0.01\n')
    cfg = load_config(Cfg, f, ["method=dfs", "optim.betas=[0.5, 0.6]"])
    assert (cfg.method, cfg.steps, cfg.optim.lr, cfg.optim.betas) == ("dfs", 4, 0.01, (0.5, 0.6))


@pytest.mark.parametrize("override, message", [
    ("stepz=1", "unknown key 'stepz'; valid keys: method, optim.betas, optim.lr, steps"),
    ("optim.lrr=1", "unknown key 'optim.lrr'; valid keys: optim.betas, optim.lr"),
    ("steps=many", "steps: Input should be a valid integer"),
    ("steps", "is not key=value"),
])
def test_config_errors_name_the_valid_keys(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(Cfg, None, [override])


def test_checkpoint_round_trip_is_bitwise(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    random.seed(5)
    np.random.seed(5)
    path = save_checkpoint(tmp_path, 2, model, opt, {"data_position": 7})
    expect_draws = (random.random(), float(np.random.rand()), torch.rand(1).item())
    params = [p.detach().clone() for p in model.parameters()]
    moments = [s["exp_avg"].clone() for s in opt.state.values()]

    model2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    assert latest_checkpoint(tmp_path) == path
    state = load_checkpoint(path, model2, opt2)
    assert state == {"step": 2, "data_position": 7}
    assert all(torch.equal(a, b) for a, b in zip(params, model2.parameters(), strict=True))
    assert all(torch.equal(a, s["exp_avg"]) for a, s in zip(moments, opt2.state.values(), strict=True))
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expect_draws


def test_checkpoints_rotate_and_latest_points_at_newest(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert names == ["step-000002", "step-000003"]
    assert latest_checkpoint(tmp_path).name == "step-000003"
    # A leftover temporary folder from a killed writer is never taken for a checkpoint.
    (tmp_path / "checkpoints" / ".tmp-step-000004-1").mkdir()
    assert latest_checkpoint(tmp_path).name == "step-000003"


def test_metrics_logger_drops_steps_past_the_resume_point(tmp_path):
    log = MetricsLogger(tmp_path)
    for s in range(5):
        log.log(s, {"loss": torch.tensor(float(s))})
    log.close()
    log = MetricsLogger(tmp_path, resume_step=3)
    log.log(3, {"loss": 30.0})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
