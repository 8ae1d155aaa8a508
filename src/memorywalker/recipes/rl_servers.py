"""The RL recipe's ``rollout_engine=vllm-server``: a fleet of ``vllm serve`` processes sampling every rank's
sessions, and the trainer's weights pushed to it after every update (docs/harness-rl.md, "At scale").

    torchrun --nproc-per-node 2 -m memorywalker rl tasks=FILE harness=opencode parallel=fsdp \\
        rollout_engine=vllm-server vllm_serve=1 vllm_serve_args="--tensor-parallel-size 2"

The fleet is ``vllm_servers=URL[,URL...]`` (servers the user started, with the flags of
:data:`~memorywalker.samplers.vllm_server.REQUIRED_FLAGS` and ``VLLM_SERVER_DEV_MODE=1``), or
``vllm_serve=N`` servers that rank 0 starts on this node with ``vllm_serve_args`` (the user's own vLLM
arguments; ``vllm_python``: the interpreter that has vLLM) and stops when the run ends. Every rank gets
the URLs; each rank's gateway sends its sessions to the fleet (:mod:`memorywalker.recipes.rl_harness`).

**Sync** (:meth:`RolloutServers.sync`), at the start of the run and after every optimizer step, before
anything samples: the weights are gathered whole on rank 0 only (a sharded model one tensor at a time,
:func:`~memorywalker.train.fsdp.main_rank_weights`), and reach every server one of two ways
(:mod:`~memorywalker.samplers.weight_sync`): ``weight_sync=shards`` writes them as safetensors shards to
``weight_sync_dir`` (default ``/dev/shm`` when every server is on this machine, else the run dir: a path
every server must read) for every server to load; ``weight_sync=broadcast`` sends them from rank 0 over
a process group with every server worker (NCCL on GPUs, gloo on the CPU; ``weight_sync_host``: rank 0's
address as the servers reach it, by default this machine's on the route to the first server). Each
server then reports ``weight_version`` ``step-K``. Then the proof: each server's prompt logprobs of a
fixed probe must equal the trainer's own forward of the new weights within ``sync_check_tol`` (fp32
default 1e-4; the cross-engine floor on the CPU: ~1e-6 for a kit model, 4.1e-5 for SmolLM2's 30
layers); a bigger gap, a server that did not load, or a version not the step's stops the run on every
rank with one line (:class:`~memorywalker.samplers.vllm_server.SyncError`) — never a step sampled from
stale weights. Logged: ``weight_sync_seconds``, ``sync_max_abs_diff``.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path
from urllib.parse import urlparse

import torch

from memorywalker.errors import InputError
from memorywalker.samplers.vllm_server import ServerFleet, SyncError, start_servers
from memorywalker.samplers.weight_sync import write_shards
from memorywalker.train.adapter import engine_model
from memorywalker.train.distributed import DistInfo, broadcast_from_main, gather_objects
from memorywalker.train.fsdp import gathered, is_sharded, main_rank_weights

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PROBE = ("The weights in this server must be the trainer's own: this probe's logprobs are compared, token by "
         "token, with a plain forward of the model that was just updated.")


class RolloutServers:
    """The fleet of one run (see the module docstring). ``closing`` stops what this run started."""

    def __init__(self, cfg, tokenizer, info: DistInfo, run_dir: Path, closing: ExitStack, *, positions: int,
                 stop_ids: list[int], log=print):
        self.cfg, self.info, self.log = cfg, info, log
        urls, error, self.sync_dir, self.host = None, None, None, None
        if info.is_main:  # rank 0 starts (or finds) the fleet; every rank learns the URLs, or why there are none
            try:
                if cfg.vllm_servers:
                    urls = [u.strip() for u in cfg.vllm_servers.split(",") if u.strip()]
                else:
                    urls = closing.enter_context(start_servers(
                        cfg.model, cfg.vllm_serve, log_dir=run_dir / "vllm-serve", served_name=cfg.served_name,
                        tokenizer=cfg.tokenizer, dtype=cfg.dtype, max_model_len=cfg.vllm_max_model_len or positions,
                        args=cfg.vllm_serve_args, python=cfg.vllm_python, log=log))
                ServerFleet(urls, model=cfg.served_name).check_ready()
            except OSError as e:  # BackendDown, SyncError: a server that is not there or cannot be synced
                error = str(e)
        urls, error = broadcast_from_main((urls, error))
        if error is not None:
            raise SyncError(error)
        self.fleet = ServerFleet(urls, model=cfg.served_name, temperature=cfg.temperature,
                                 max_new_tokens=cfg.max_new_tokens, stop_ids=stop_ids, timeout=cfg.deadline)
        self.probe = tokenizer(PROBE, add_special_tokens=False)["input_ids"][:64]
        local = all(urlparse(u).hostname in LOOPBACK for u in urls)
        if info.is_main and cfg.weight_sync == "broadcast":
            self.host = cfg.weight_sync_host or ("127.0.0.1" if local else address_toward(urlparse(urls[0]).hostname))
            log(f"rl: sampling from {len(urls)} vLLM server(s): {', '.join(urls)}; weights broadcast from "
                f"{self.host} (torch {'NCCL' if torch.cuda.is_available() else 'gloo'})")
        elif info.is_main:
            if cfg.weight_sync_dir:
                self.sync_dir = Path(cfg.weight_sync_dir)
            else:
                shm = Path("/dev/shm")
                root = shm if local and shm.is_dir() else run_dir
                self.sync_dir = Path(tempfile.mkdtemp(prefix="memorywalker-weights-", dir=root))
                closing.callback(shutil.rmtree, self.sync_dir, ignore_errors=True)
            log(f"rl: sampling from {len(urls)} vLLM server(s): {', '.join(urls)}; weights synced through {self.sync_dir}")
        self.tol = cfg.sync_check_tol if cfg.sync_check_tol is not None else (1e-4 if cfg.dtype == "float32" else None)

    def sync(self, model, step: int) -> dict:
        """Push ``model``'s weights to every server as version ``step-{step}`` and prove they arrived
        (module docstring); every rank calls it, every rank raises when it failed."""
        t0 = time.perf_counter()
        self.share_down()  # a server a session found dead on any rank is out for the sync and the next step
        weights = main_rank_weights(model, is_main=self.info.is_main)  # sharded: every rank gathers, rank 0 keeps
        error, version = None, f"step-{step}"
        if self.info.is_main:
            try:
                if self.cfg.weight_sync == "broadcast":
                    self.fleet.broadcast_weights(weights, version, host=self.host)
                else:
                    n = write_shards(weights, self.sync_dir)
                    del weights
                    self.fleet.sync_weights(self.sync_dir, version, expect=n)
                served = self.fleet.served_versions()
                stale = {u: v for u, v in served.items() if v != version}
                if stale:
                    raise SyncError(f"servers report other weights than {version} after the sync: {stale}")
            except (SyncError, OSError) as e:
                error = str(e)
        worst = None
        if self.tol is not None:
            expected = self._probe_logprobs(model)  # fsdp: every rank runs the forward
            if self.info.is_main and error is None:
                try:
                    worst = self.fleet.check_sync(self.probe, expected, tol=self.tol)
                except (SyncError, OSError) as e:
                    error = str(e)
        errors = [e for e in gather_objects(error) if e]  # every rank stops, not just rank 0
        self.share_down()  # servers rank 0 found dead while syncing
        if errors:
            raise SyncError(f"rl: weight sync before step {step} failed, the run stops before sampling: {errors[0]}")
        # seconds from gathering the weights to the probe's answer; the version the servers now report
        return {"weight_sync_seconds": time.perf_counter() - t0, "sync_max_abs_diff": worst, "weight_version": step}

    @torch.no_grad()
    def _probe_logprobs(self, model) -> list[float]:
        """log p(probe[i] | probe[:i]) under the trainer's weights (a plain forward, untempered)."""
        lm = engine_model(model)
        device = next(lm.parameters()).device
        ids = torch.tensor([self.probe])
        with gathered(model) if is_sharded(model) else nullcontext():
            logits = lm(input_ids=ids.to(device)).logits[0].float()  # [L, V]
        lp = torch.log_softmax(logits, dim=-1)
        return [lp[i - 1, t].item() for i, t in enumerate(self.probe) if i > 0]

    def share_down(self) -> None:
        """Every rank learns which servers any rank found down."""
        for downs in gather_objects({s.url: s.down for s in self.fleet.servers if s.down is not None}):
            for url, why in downs.items():
                self.fleet.mark_down(url, why)

    def check_alive(self) -> None:
        """One line when no server of the fleet is left (the step cannot continue)."""
        if not self.fleet.live():
            raise InputError(f"rl: every vLLM server is down, the run stops: {self.fleet.why_down()}")


def address_toward(host: str) -> str:
    """This machine's address on the route to ``host`` (what the kernel would send from; no packet sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]
