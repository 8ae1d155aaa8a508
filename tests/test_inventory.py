"""``memorywalker inventory``: the worked example's numbers exactly, and counts that PEFT confirms."""

from __future__ import annotations

from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.train.inventory import from_model_config, inventory, lora_parameters


def test_worked_example():
    """32 layers × 2 matrices × 16·(4096 + 4096) = 8,388,608 adapter parameters = 0.10 % of 8e9;
    × 16 B = 134,217,728 B = 134.22 MB; frozen 8e9 × 2 B = 16 GB, total 16.134 GB; full 8e9 × 16 B
    = 128 GB; 128 / 16.134 = 7.93."""
    n = lora_parameters([(4096, 4096)] * 2, rank=16, layers=32)
    assert n == 8_388_608
    inv = inventory(8e9, n)
    assert inv["adapter_bytes"] == 134_217_728
    assert inv["adapter_total_bytes"] == 16e9 + 134_217_728
    assert inv["full_bytes"] == 128e9
    assert abs(inv["ratio"] - 128e9 / (16e9 + 134_217_728)) < 1e-12
    out = CliRunner().invoke(app, ["inventory", "--params", "8e9", "--layers", "32", "--shape", "4096x4096",
                                   "--matrices", "2", "--rank", "16"]).output
    for line in ("8,388,608 (0.10 %)", "134.22 MB", "adapter training     16.13 GB", "full training        128.00 GB",
                 "7.9x"):
        assert line in out, out


def test_counts_from_a_model_config_match_the_model_and_peft(kit):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base, adapter = from_model_config(kit[1], rank=4, target_modules=["q_proj", "v_proj"])
    model = AutoModelForCausalLM.from_pretrained(kit[1])
    assert base == sum(p.numel() for p in model.parameters())
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert adapter == peft.get_nb_trainable_parameters()[0]
    r = CliRunner().invoke(app, ["inventory"])
    assert r.exit_code == 2 and "--model DIR or --params N" in r.output
