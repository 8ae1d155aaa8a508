"""A real 2-process data-parallel run (torch.distributed, gloo, DistributedDataParallel) gives the
gradient of one pass over the whole batch, for ``token`` and ``trajectory`` normalization."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from engine_cases import grads, load_model, max_rel_grad_diff, one_thread, random_batch
from memorywalker.engine import EngineConfig, run, step_denominators
from memorywalker.render import Renderer
from ranks import spawn

CASES = [("tree-mask", "token"), ("tree-mask", "trajectory"), ("logit-tree", "token"), ("logit-tree", "trajectory")]
SHARDS = [[1], [0, 2]]  # rank 0 gets the forest, rank 1 the long episode and the short one


def _worker(rank: int, world: int, tok_dir: str, model_dir: str, out: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import AutoTokenizer

    dist.init_process_group("gloo")
    renderer = Renderer(AutoTokenizer.from_pretrained(tok_dir))
    mine = random_batch(renderer, seed=8).split([SHARDS[rank]])
    ddp = DDP(load_model(model_dir))
    result = {}
    for method, norm in CASES:
        cfg = EngineConfig(method=method, normalization=norm, dp_size=world)
        ddp.zero_grad(set_to_none=True)
        dens = step_denominators(mine, cfg)  # all-reduced over the two ranks
        loss = run(ddp, mine[0], cfg, denominators=dens).loss
        dist.all_reduce(loss)
        result[(method, norm)] = (grads(ddp.module), loss / world)  # the summed loss / dp_size
    if rank == 0:
        torch.save(result, out)


def test_two_process_ddp_matches_one_pass(kit, tokenizer, tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    out = tmp_path / "ddp.pt"
    spawn(_worker, str(kit[0]), str(kit[1]), str(out), log_dir=tmp_path)
    result = torch.load(out)

    model = load_model(kit[1])
    batch = random_batch(Renderer(tokenizer), seed=8)
    for method, norm in CASES:
        cfg = EngineConfig(method=method, normalization=norm)
        model.zero_grad(set_to_none=True)
        with one_thread():
            whole = run(model, batch, cfg)
        g_ddp, loss_ddp = result[(method, norm)]
        assert max_rel_grad_diff(g_ddp, grads(model)) <= 1e-5, (method, norm)
        assert torch.allclose(loss_ddp, whole.loss, rtol=1e-5), (method, norm)
