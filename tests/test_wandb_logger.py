"""The optional Weights & Biases logger, offline (no network): the same rows as metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from memorywalker.train.config import ConfigError, load_config
from memorywalker.train.logging import MetricsLogger, wandb_options

wandb = pytest.importorskip("wandb")


def test_wandb_offline_logs_the_jsonl_rows_and_resumes_the_same_run(tmp_path, monkeypatch):
    """Steps 0-2 logged (loss 3.0, 2.5, 2.25): the W&B run's summary holds the last row (loss 2.25,
    lr 0.1) at step 2 and its config the recipe's, metrics.jsonl the same three rows, the offline run
    file is written under run_dir/wandb; a resumed logger reopens the same W&B run id."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    opts = {"project": "memorywalker-test", "mode": "offline", "config": {"method": "radix"}}
    log = MetricsLogger(tmp_path, wandb=opts)
    for step, loss in enumerate([3.0, 2.5, 2.25]):
        log.log(step, {"loss": loss, "lr": 0.1})
    run = log._wandb
    assert run.summary["loss"] == 2.25 and run.summary["lr"] == 0.1 and run.summary["_step"] == 2
    assert run.config["method"] == "radix" and run.offline
    run_id = run.id
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == [3.0, 2.5, 2.25]
    (run_file,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    assert run_file.stat().st_size > 0

    again = MetricsLogger(tmp_path, wandb=opts, resume_step=3)
    assert again._wandb.id == run_id
    again.close()


def test_wandb_config_keys():
    from memorywalker.recipes.sft import SFTConfig

    cfg = load_config(SFTConfig, None, ["wandb=true", "wandb_mode=offline", "wandb_project=p"])
    assert wandb_options(cfg)["mode"] == "offline" and wandb_options(cfg)["config"]["method"] == "radix"
    assert wandb_options(load_config(SFTConfig, None, [])) is None
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(SFTConfig, None, ["wandb_mode=cloud"])
