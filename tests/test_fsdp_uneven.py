"""``parallel = "fsdp"`` with ranks whose trees differ (one holds a tree of 2 calls, the other one of 40):
the step schedule (train/sharded_step.py) gathers one decoder layer at a time, the ranks agree on every
pass, nobody hangs, and SFT (radix, per-call; untied and tied LM head), LoRA and DPO steps equal their
single-process runs.

One spawn of 2 gloo processes runs every case (starting processes costs more than the runs); the
single-process references run here, on the whole global batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup  # private: the hook observed
from transformers import AutoModelForCausalLM, AutoTokenizer

from memorywalker.engine import EngineConfig, run, step_denominators
from memorywalker.engine.synthetic import SyntheticSpec, synthetic_group, synthetic_trajectory
from memorywalker.layout.batch import Batch
from memorywalker.recipes import dpo, sft
from memorywalker.records.io import write_trajectories
from memorywalker.render import Renderer
from memorywalker.train.fsdp import decoder_layers, enable_activation_checkpointing, fsdp_modules, shard_model
from memorywalker.train.row_shards import row_shards
from memorywalker.train.sharded_step import StepSchedule
from ranks import spawn

SMALL, BIG = 2, 40  # calls in the two trees
STEP = dict(steps=2, batch_size=2, lr=0.1, adam_eps=1.0, collective_timeout=120)
LORA = {"kind": "lora", "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def uneven() -> list:
    """A tree of 2 calls and one of 40 (a compaction every 4 calls): a batch of 2 puts one on each rank."""
    return [synthetic_trajectory(SyntheticSpec(turns=SMALL, evictions=1, words=6, seed=0), "small"),
            synthetic_trajectory(SyntheticSpec(turns=BIG, evictions=BIG // 4, words=6, seed=1), "big")]


def dpo_inputs(root: Path) -> tuple[Path, Path]:
    """Two pairs, each a GRPO group's two rollouts: one group of 2-call episodes, one of 12-call ones."""
    groups = [synthetic_group(SyntheticSpec(turns=n, evictions=n // 4 or 1, words=5, seed=n), f"task{n}", 2)
              for n in (SMALL, 12)]
    data, pairs = root / "dpo-data.jsonl", root / "dpo-pairs.jsonl"
    if pairs.exists():  # written once, by the fixture, before the ranks start
        return data, pairs
    write_trajectories(data, [t for g in groups for t in g])
    pairs.write_text("".join(json.dumps({"chosen": g[0].id, "rejected": g[1].id}) + "\n" for g in groups))
    return data, pairs


def tied_model(kit, root: Path) -> Path:
    """The kit model with its LM head tied to the embedding (one parameter, sharded by rows with the head)."""
    out = root / "tied-model"
    if not (out / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(kit[1])
        model.config.tie_word_embeddings = True
        model.tie_weights()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        model.save_pretrained(out)
    return out


def cases(kit, root: Path) -> dict[str, tuple]:
    """name -> (recipe, config kwargs): each run twice, on 2 fsdp ranks and on one process."""
    data, pairs = dpo_inputs(root)
    base = dict(model=str(kit[1]), tokenizer=str(kit[0]))
    return {
        "sft-radix": (sft, {**base, **STEP, "method": "radix"}),
        "sft-tied-radix": (sft, {**base, **STEP, "method": "radix", "model": str(tied_model(kit, root))}),
        "sft-per-call": (sft, {**base, **STEP, "method": "per-call"}),
        "sft-lora-radix": (sft, {**base, **STEP, "method": "radix", "adapter": LORA}),
        "dpo-radix": (dpo, {**base, **STEP, "method": "radix", "beta": 0.5, "data": str(data), "pairs": str(pairs)}),
    }


def train(recipe, run_dir: Path, kw: dict):
    if recipe is sft:
        return sft.train(sft.SFTConfig(run_dir=str(run_dir), **kw), trajectories=uneven(), progress=False)
    return dpo.train(dpo.DPOConfig(run_dir=str(run_dir), **kw), progress=False)


def probe(kit, rank: int) -> dict:
    """One radix step by hand on this rank's tree; records how many decoder layers are gathered whenever
    one runs its forward, and the schedule's passes."""
    tok = AutoTokenizer.from_pretrained(kit[0])
    model = shard_model(AutoModelForCausalLM.from_pretrained(kit[1]))
    layers = decoder_layers(model)
    gathered = []

    units = row_shards(model)
    head, embedding = units.head, units.embedding
    sharded = {"head_rows": head.module.weight.to_local().shape[0], "vocab": head.module.weight.shape[0],
               "embedding_rows": embedding.module.weight.to_local().shape[0],
               "fsdp_units": [type(m).__name__ for m in fsdp_modules(model)]}
    seen = {"embedding": [], "head": [], "head_in_backward": []}

    def count(*_):
        gathered.append(sum(g.is_unsharded for m in layers for g in m._get_fsdp_state()._fsdp_param_groups))
        seen["embedding"].append(embedding.holds_weights)
        seen["head"].append(head.holds_weights)

    def in_backward(*_):  # is the head's whole weight held while a layer runs its backward?
        seen["head_in_backward"].append(head.holds_weights)

    for m in layers:
        m.register_forward_pre_hook(count)
        m.register_full_backward_pre_hook(in_backward)
    found = []  # per decoder-layer post-backward: did FSDP find this forward's gradient to reduce-scatter?
    real_post_backward = FSDPParamGroup.post_backward

    def post_backward(group, *args):
        if group._module_fqn.startswith("model.layers."):
            found.append(all(p.unsharded_param.grad is not None for p in group.fsdp_params
                             if hasattr(p, "_unsharded_param")))
        return real_post_backward(group, *args)

    FSDPParamGroup.post_backward = post_backward
    traj = uneven()[rank]
    batch = Batch.from_groups([[Renderer(tok).render(traj)]])
    cfg = EngineConfig(method="radix", max_tokens=64)  # several forwards per tree level on the big tree
    dens = step_denominators([batch], cfg)
    with StepSchedule(model) as schedule:
        out = run(model, batch, cfg, denominators=dens, schedule=schedule)
    FSDPParamGroup.post_backward = real_post_backward
    after = sum(g.is_unsharded for m in fsdp_modules(model) for g in m._get_fsdp_state()._fsdp_param_groups)
    return {"gathered": gathered, "after": after, "found": found, "layers": len(layers), "counts": {k: schedule.counts[k] for k in (
        "grad_forwards", "backwards", "empty_forwards", "empty_backwards")}, "forwards": out.metrics["forwards"],
        **sharded, **seen, "after_step": [head.is_gathered, embedding.is_gathered],
        "grad_rows": [u.shards[0].grad.to_local().shape[0] for u in (head, embedding)]}


def dangling(kit, rank: int) -> dict:
    """Rank 0 runs a forward with grad whose output feeds no loss (a buffer without a trained target) and
    never calls backward; rank 1 runs nothing. Leaving the block must not hang or fail."""
    model = shard_model(AutoModelForCausalLM.from_pretrained(kit[1]))
    with StepSchedule(model) as schedule:
        if rank == 0:
            model(input_ids=torch.tensor([[5, 6, 7]]))
    grads = [p.grad for p in model.parameters()]
    return {"counts": dict(schedule.counts), "zero_grads": all(g is not None and not g.full_tensor().any() for g in grads)}


def _worker(rank: int, world: int, kit, root: str) -> None:
    for name, (recipe, kw) in cases(kit, Path(root)).items():
        train(recipe, Path(root) / f"fsdp-{name}", {**kw, "parallel": "fsdp"})
    torch.save(probe(kit, rank), Path(root) / f"probe{rank}.pt")
    torch.save(dangling(kit, rank), Path(root) / f"dangling{rank}.pt")


@pytest.fixture(scope="module")
def uneven_runs(kit, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fsdp-uneven")
    cases(kit, root)  # the inputs both runs read, written once
    spawn(_worker, kit, str(root), log_dir=root)
    return root


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    final = run_dir / "final"
    name = "adapter_model.safetensors" if (final / "adapter_model.safetensors").exists() else "model.safetensors"
    return load_file(str(final / name))


@pytest.mark.parametrize("name", ["sft-radix", "sft-tied-radix", "sft-per-call", "sft-lora-radix", "dpo-radix"])
def test_uneven_ranks_equal_the_single_process_run(kit, tmp_path, uneven_runs, name):
    """Every step's loss and gradient norm on 2 fsdp ranks (one tree of 2 calls, one of 40; DPO: a pair
    of 2-call and a pair of 12-call episodes; untied and tied LM head) equal one process on both trees
    to 1e-5, and the final
    weights (LoRA: the adapter's) agree to 1e-5 of the largest. The rank with the small tree ran empty
    passes to match the other's (``empty_forwards`` > 0): the trees really were uneven."""
    recipe, kw = cases(kit, uneven_runs)[name]
    torch.set_num_threads(1)
    one = train(recipe, tmp_path / name, kw)
    got = metrics(uneven_runs / f"fsdp-{name}")
    assert len(got) == len(one.metrics) == 2
    for a, b in zip(got, one.metrics, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7), (name, a["step"])
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), (name, a["step"])
        assert a["empty_forwards"] > 0, name
    wa, wb = final_weights(uneven_runs / f"fsdp-{name}"), final_weights(tmp_path / name)
    assert set(wa) == set(wb) and wa
    if name.startswith("sft-lora"):
        assert all(".lora_" in k for k in wa)  # the adapter, not a merged model
    biggest = max(v.abs().max().item() for v in wb.values())
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5 * biggest, name


def test_one_layer_gathered_at_a_time_and_ranks_agree_on_passes(uneven_runs):
    """Whenever a decoder layer starts its forward, it is the only one gathered (FSDP2 resharded the one
    before), the embedding is not (resharded after the lookup) and the LM head is (the engine applies it
    after the forwards); once a rank's chunked loss has run its backward the head's whole weight is
    freed, before the layers' backward; after the step only shards remain. Each layer's post-backward, once per forward, finds that forward's
    gradient to reduce-scatter (without train/fsdp.reduce_per_forward autograd would hold it until the
    layer's last forward had run: the whole unsharded gradient). Rank 0 (2 calls) ran as many forwards with grad and backwards as
    rank 1 (40 calls), the difference in empty ones: its real forwards + empty forwards = rank 1's."""
    p0, p1 = torch.load(uneven_runs / "probe0.pt"), torch.load(uneven_runs / "probe1.pt")
    for p in (p0, p1):
        assert p["gathered"] and set(p["gathered"]) == {1}, p["gathered"]
        assert p["after"] == 0
        # every forward's backward hands FSDP its gradient (train/fsdp.reduce_per_forward): one
        # post-backward per layer per forward, none finding the gradient still held by autograd
        assert len(p["found"]) == p["layers"] * (p["counts"]["grad_forwards"] + p["counts"]["empty_forwards"]) and all(p["found"])
    c0, c1 = p0["counts"], p1["counts"]
    assert p1["forwards"] > p0["forwards"]  # the 40-call tree needs more radix forwards
    for p in (p0, p1):  # the embedding and the LM head sharded by rows, each whole only while used
        assert p["fsdp_units"] == ["FSDPLlamaForCausalLM"] + ["FSDPLlamaDecoderLayer"] * p["layers"]
        assert not any(p["embedding"])  # freed right after each lookup
        assert all(p["head"]) and p["after_step"] == [False, False]  # whole through each forward; shards after
        assert p["head_rows"] == p["embedding_rows"] == p["vocab"] // 2 and p["grad_rows"] == [p["vocab"] // 2] * 2
        assert not p["head_in_backward"][-1]  # freed before the first forward's layers ran their backward
    assert not any(p1["head_in_backward"])  # rank 1 ran real forwards only: freed before any layer's backward
    assert c0["grad_forwards"] + c0["empty_forwards"] == c1["grad_forwards"] + c1["empty_forwards"]
    assert c0["empty_forwards"] == p1["forwards"] - p0["forwards"] and c1["empty_forwards"] == 0
    assert c0["backwards"] + c0["empty_backwards"] == c1["backwards"] + c1["empty_backwards"] == 1


def test_activation_checkpointing_recomputes_in_eval_mode_without_dropout(kit):
    """rl and dpo keep the model in eval mode (no dropout), where transformers would skip checkpointing:
    with ``activation_checkpointing`` each decoder layer still recomputes in backward — layer 0's
    attention runs twice for one forward + backward, once for a no-grad forward — its attention stays
    in eval mode, and the gradients equal the plain model's."""
    plain = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    ckpt = AutoModelForCausalLM.from_pretrained(kit[1]).eval()
    enable_activation_checkpointing(ckpt)
    calls = []
    attn = decoder_layers(ckpt)[0].self_attn
    attn.register_forward_hook(lambda m, a, o: calls.append(m.training))
    ids = torch.arange(3, 40)[None]
    for model in (plain, ckpt):
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    assert calls == [False, False]  # the forward and its recomputation, both without dropout
    with torch.no_grad():
        ckpt(input_ids=ids)
    assert len(calls) == 3
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_forward_with_grad_and_no_backward_ends_the_step_on_every_rank(uneven_runs):
    """Rank 0's forward with grad but no loss, rank 1's nothing: leaving the block runs one backward on
    both (rank 1 through its empty forward), so FSDP's armed hooks and collectives pair up; the
    gradients are exact zeros (0·logits), every parameter has one."""
    d0, d1 = torch.load(uneven_runs / "dangling0.pt"), torch.load(uneven_runs / "dangling1.pt")
    assert d0["counts"]["grad_forwards"] == 1 and d1["counts"]["empty_forwards"] == 1
    assert d0["counts"]["empty_backwards"] == d1["counts"]["empty_backwards"] == 1
    assert d0["zero_grads"] and d1["zero_grads"]
