"""The DPO recipe end to end, LoRA adapters for the recipes, and the training manifest's hashes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_cases import load_model as load_plain
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
from memorywalker.recipes import dpo, sft
from memorywalker.records.io import write_trajectories
from memorywalker.train.adapter import load_adapter
from memorywalker.train.manifest import MANIFEST_NAME, file_sha256
from memorywalker.train.refcache import template_hash, tokenizer_hash, weights_hash


def records() -> list:
    groups = [synthetic_group(SyntheticSpec(turns=3, evictions=1, words=5, seed=s), f"task{s}", 2) for s in (0, 1)]
    other = synthetic_trajectory(SyntheticSpec(turns=3, evictions=1, words=5, seed=9), "other")
    return [t for g in groups for t in g] + [other]


PAIRS = [("task0-r0", "task0-r1"), ("task1-r1", "task1-r0"), ("task0-r0", "other"), ("task0-r0", "missing")]


def write_inputs(tmp_path) -> tuple[Path, Path]:
    data, pairs = tmp_path / "data.jsonl", tmp_path / "pairs.jsonl"
    write_trajectories(data, records())
    pairs.write_text("".join(json.dumps({"chosen": w, "rejected": lo}) + "\n" for w, lo in PAIRS))
    return data, pairs


def dpo_cfg(kit, run_dir, data, pairs, **kw) -> dpo.DPOConfig:
    return dpo.DPOConfig(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), data=str(data),
                         pairs=str(pairs), **{"batch_size": 2, "beta": 0.5, "lr": 1e-3, **kw})


def check_manifest(run_dir: Path, kit, inputs: list[Path]) -> dict:
    """Every hash of the training manifest, recomputed from the files."""
    from transformers import AutoTokenizer

    m = json.loads((run_dir / MANIFEST_NAME).read_text())
    assert [i["sha256"] for i in m["inputs"]] == [file_sha256(p) for p in inputs]
    final = run_dir / "final"
    files = {str(p.relative_to(final)): file_sha256(p) for p in sorted(final.rglob("*")) if p.is_file()}
    assert m["artifacts"] == files and files
    assert m["base_model_hash"] == weights_hash(load_plain(kit[1]))
    tok = AutoTokenizer.from_pretrained(kit[0])
    assert (m["tokenizer_hash"], m["template_hash"]) == (tokenizer_hash(tok), template_hash(tok))
    assert m["config"]["seed"] == m["seeds"]["seed"] and m["package_version"]
    return m


def test_dpo_run_admits_pairs_learns_and_writes_its_manifest(kit, tmp_path, capsys):
    """The reference is the policy as loaded, so step 0 has margin 0 and loss log 2 = 0.693147; the
    full-batch steps raise the margin. The pair across two tasks and the pair naming a missing record
    are rejected with their reasons. Every call of the 5 records has a target: none left out."""
    data, pairs = write_inputs(tmp_path)
    run = tmp_path / "run"
    res = dpo.train(dpo_cfg(kit, run, data, pairs, steps=3), progress=False)
    assert f"dpo: calls left out: none of {sum(len(t.calls) for t in records())}" in capsys.readouterr().out
    curve = [m["loss"] for m in res.metrics]
    assert curve[0] == pytest.approx(math.log(2), abs=1e-6)
    assert res.metrics[0]["margin"] == pytest.approx(0.0, abs=1e-6)
    assert curve[2] < curve[1] < curve[0] and res.metrics[2]["margin"] > 0
    rejects = [json.loads(x) for x in (run / "pair_rejects.jsonl").read_text().splitlines()]
    assert [(r["chosen"], r["rejected"]) for r in rejects] == PAIRS[2:]
    assert "contexts differ before the branch" in rejects[0]["reason"]
    assert "no record with id missing" in rejects[1]["reason"]
    m = check_manifest(run, kit, [data, pairs])
    assert [(p["chosen"], p["rejected"]) for p in m["pairs"]] == PAIRS[:2]
    assert sorted(r["id"] for r in m["records"]) == ["task0-r0", "task0-r1", "task1-r0", "task1-r1"]
    assert len(json.loads((run / "ref_logprobs.json").read_text())) == 4  # 2 pairs × 2 sides


def test_dpo_cli_errors_are_one_line(kit, tmp_path):
    from typer.testing import CliRunner

    from memorywalker.cli.main import app

    data, pairs = write_inputs(tmp_path)
    r = CliRunner().invoke(app, ["dpo", f"data={data}", f"pairs={pairs}", "normalization=token",
                                 f"run_dir={tmp_path / 'r'}"])
    assert r.exit_code == 2 and "normalization must be 'sequence'" in r.output
    r = CliRunner().invoke(app, ["dpo", f"model={kit[1]}", f"data={data}", f"pairs={tmp_path / 'nope.jsonl'}",
                                 f"run_dir={tmp_path / 'r2'}"])
    assert r.exit_code == 2 and "nope.jsonl" in r.output


# --- LoRA ------------------------------------------------------------------------------------------

LORA = {"adapter": {"kind": "lora", "rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}}


def run_recipe(recipe: str, kit, tmp_path, run_dir, **kw):
    if recipe == "sft":
        from memorywalker.engine.synthetic import SyntheticSpec as S

        trajs = [synthetic_trajectory(S(turns=3, evictions=1, words=5, seed=i), f"ep-{i}") for i in range(2)]
        cfg = sft.SFTConfig(model=str(kit[1]), tokenizer=str(kit[0]), run_dir=str(run_dir), batch_size=2, lr=1e-2,
                            **LORA, **kw)
        return sft.train(cfg, trajectories=trajs, progress=False)
    data, pairs = write_inputs(tmp_path)
    return dpo.train(dpo_cfg(kit, run_dir, data, pairs, **LORA, **{"lr": 1e-2, **kw}), progress=False)


@pytest.mark.parametrize("recipe", ["sft", "dpo"])
def test_lora_changes_only_the_adapter_resumes_exactly_and_merges(recipe, kit, tmp_path):
    """Only lora_A/lora_B tensors differ from the base after training; a run stopped after step 1 and
    resumed ends bitwise equal to an uninterrupted one; the merged model's logprobs equal the
    adapter-applied model's (1e-5); the adapter refuses a different base."""
    from memorywalker.train.model import load_model

    full = run_recipe(recipe, kit, tmp_path, tmp_path / "full", steps=2, save_every=1)
    ckpt = load_file(str(tmp_path / "full" / "checkpoints" / "step-000002" / "model.safetensors"))
    base = load_file(str(Path(kit[1]) / "model.safetensors"))
    lora = {k: v for k, v in ckpt.items() if "lora_" in k}
    assert lora and all(k.split(".")[-4] in ("q_proj", "v_proj") for k in lora if "lora_A" in k)
    for k, v in ckpt.items():
        if "lora_" in k:
            continue
        name = k.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(v, base[name]), k  # frozen
    assert any(v.abs().sum() > 0 for k, v in lora.items() if "lora_B" in k)  # B left its zero init

    part = run_recipe(recipe, kit, tmp_path, tmp_path / "part", steps=1, save_every=1)
    assert part.steps == 1
    run_recipe(recipe, kit, tmp_path, tmp_path / "part", steps=2, save_every=1, resume=True)
    a = load_file(str(tmp_path / "full" / "final" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "part" / "final" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    manifest = json.loads((full.final_dir / "adapter_manifest.json").read_text())
    assert manifest["rank"] == 4 and manifest["target_modules"] == ["q_proj", "v_proj"]
    assert manifest["base_model_hash"] == weights_hash(load_plain(kit[1]))
    adapted = load_adapter(load_plain(kit[1]), full.final_dir).eval()
    merged, _ = load_model(str(full.final_dir), str(kit[0]), dtype="float32", device=torch.device("cpu"))
    ids = torch.tensor([list(range(5, 40))])
    with torch.no_grad():
        la = torch.log_softmax(adapted(input_ids=ids).logits, -1)
        lm = torch.log_softmax(merged.eval()(input_ids=ids).logits, -1)
        lb = torch.log_softmax(load_plain(kit[1]).eval()(input_ids=ids).logits, -1)
    assert (la - lm).abs().max().item() <= 1e-5
    assert (la - lb).abs().max().item() > 1e-4  # the adapter did change the function

    other = load_plain(kit[1])
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1.0
    with pytest.raises(ValueError, match="was trained on base"):
        load_adapter(other, full.final_dir)


@pytest.mark.parametrize("method", ["per-call", "logit-tree", "radix", "tree-mask"])
def test_every_exact_method_runs_on_a_lora_model(kit, renderer, method):
    """The engine on ``engine_model(peft_model)`` gives the adapted model's plain per-call logprobs
    (1e-5) and gradients (1e-4 relative), and only adapter parameters get a gradient."""
    from engine_cases import grads, max_rel_grad_diff, one_thread
    from memorywalker.engine import EngineConfig, run
    from memorywalker.layout import Batch
    from memorywalker.train.adapter import apply_adapter, engine_model
    from memorywalker.train.config import AdapterConfig

    torch.manual_seed(0)
    model = apply_adapter(load_plain(kit[1]), AdapterConfig(kind="lora", rank=4))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)  # a non-zero update, so the adapter matters
    groups = [[renderer.render(t) for t in synthetic_group(SyntheticSpec(turns=3, evictions=1, words=5), "lm", 2)]]
    with one_thread():
        model.zero_grad(set_to_none=True)
        ref = []
        for rt in groups[0]:
            for rc in rt.calls:
                if rc.targets:
                    logp = torch.log_softmax(model(input_ids=torch.tensor([rc.tokens])).logits[0].float(), -1)
                    idx = torch.tensor(rc.targets)
                    ref.append(logp[idx - 1, torch.tensor(rc.tokens)[idx]])
        ref = torch.cat(ref)
        (-ref.sum() / len(ref)).backward()
        want = grads(model)
        model.zero_grad(set_to_none=True)
        res = run(engine_model(model), Batch.from_groups(groups), EngineConfig(method=method, attention="sdpa"))
    assert (res.logprobs - ref.detach()).abs().max().item() <= 1e-5
    assert max_rel_grad_diff(grads(model), want) <= 1e-4
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)
