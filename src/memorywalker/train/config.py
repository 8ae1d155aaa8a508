"""Typed recipe configs: a TOML file plus ``key=value`` overrides; unknown keys fail with the valid ones.

>>> class Cfg(RecipeConfig):
...     steps: int = 10
...     lr: float = 1e-3
>>> load_config(Cfg, None, ["steps=3", "lr=0.5"]).lr
0.5
>>> load_config(Cfg, None, ["stepz=3"])
Traceback (most recent call last):
...
memorywalker.train.config.ConfigError: unknown key 'stepz'; valid keys: lr, steps
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from memorywalker.engine import get_method
from memorywalker.engine.config import EngineConfig
from memorywalker.errors import InputError
from memorywalker.objectives.normalize import TARGET_NORMALIZATIONS
from memorywalker.render import RenderOptions

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(InputError):
    pass


PARALLEL = ("ddp", "fsdp")  # TrainConfig.parallel: how the ranks split the model (train/fsdp.py)
# The fields that take one of a few names, and the names (checked by one validator, one message;
# normalization has its own, which DPO replaces: it normalizes per pair).
CHOICES: dict[str, tuple] = {
    "sdcc_students": ("junctions", "all"),
    "dtype": ("float32", "bfloat16", "float16"), "wandb_mode": ("online", "offline", "disabled"),
    "parallel": PARALLEL, "mixed_precision": (None, "bfloat16", "float16", "float32"),
}


def check_choice(field: str, value: Any, choices) -> Any:
    """``value`` when it is one of ``choices``, else an InputError naming the valid ones.

    >>> check_choice("parallel", "tp", PARALLEL)
    Traceback (most recent call last):
    memorywalker.errors.InputError: unknown parallel 'tp'; valid: ddp, fsdp
    """
    if value not in choices:
        named = [str(c) for c in choices if c is not None]
        unset = " (or unset)" if None in choices else ""
        raise InputError(f"unknown {field} {value!r}; valid: {', '.join(named)}{unset}")
    return value
ENGINE_DEFAULTS = EngineConfig()  # the engine's defaults, which the recipe configs take over


class RecipeConfig(BaseModel):
    """Base of every recipe config: strict (unknown fields are errors), validated on assignment.

    ``RENAMED_KEYS`` (old key -> field) are keys a recipe renamed: still accepted, with a
    DeprecationWarning naming the new one; both at once are an error.

    >>> class Cfg(RecipeConfig):
    ...     RENAMED_KEYS = {"max_turns": "max_steps"}
    ...     max_steps: int = 8
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     Cfg(max_turns=3).max_steps, str(w[0].message)
    (3, 'max_turns= is now max_steps=: write max_steps=3')
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
    RENAMED_KEYS: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        if not isinstance(data, dict):
            return data
        for old, new in cls.RENAMED_KEYS.items():
            if old in data:
                if new in data:
                    raise InputError(f"{old}= is now {new}=: give {new}= only")
                warnings.warn(f"{old}= is now {new}=: write {new}={data[old]}", DeprecationWarning, stacklevel=2)
                data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data


class AdapterConfig(RecipeConfig):
    """``adapter.*``: train a LoRA adapter through PEFT instead of the full weights (Hu et al. 2021,
    https://arxiv.org/abs/2106.09685). ``kind="none"`` (the default) trains every weight."""

    kind: str = "none"  # none | lora
    rank: int = 16  # r: rank of the update B·A
    alpha: float = 32.0  # scaling α / r of the update
    target_modules: list[str] = ["q_proj", "v_proj"]  # module names (suffixes) that get an adapter
    dropout: float = 0.0  # dropout on the adapter's input (0: the trainer and the sampler see one function)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in ("none", "lora"):
            raise InputError(f"unknown adapter kind {v!r}; valid: none, lora")
        return v

    @field_validator("rank")
    @classmethod
    def _rank(cls, v: int) -> int:
        if v < 1:
            raise InputError("must be >= 1")
        return v


class TrainConfig(RecipeConfig):
    """Fields every training recipe has (model, engine, optimizer, checkpoints); recipes add their own."""

    # --- model
    model: str = "kit"  # local Hugging Face causal LM dir, or "kit" = the offline tiny model (modelkit)
    tokenizer: str | None = None  # tokenizer dir with a chat template; default: the model's
    chat_template: str | None = None  # render with this template instead: a Jinja file or a shipped name (render/chat_templates.py)
    dtype: str = "float32"  # parameter dtype: float32 | bfloat16 | float16
    device: str = "auto"  # auto = this rank's GPU if CUDA is available, else cpu
    # --- engine (DESIGN.md): memorywalker.engine.EngineConfig's fields of the same names, its defaults
    method: str = ENGINE_DEFAULTS.method  # a method of the registry (memorywalker.engine.METHODS)
    normalization: str = ENGINE_DEFAULTS.normalization  # objectives.normalize.TARGET_NORMALIZATIONS
    attention: str | None = ENGINE_DEFAULTS.attention  # mask-schedule methods: sdpa | eager | flex; None = the model's own
    max_tokens: int = ENGINE_DEFAULTS.max_tokens  # tokens per forward (packed buffer / radix chunk and batch size)
    # Longest call sequence S_t a trajectory may have; longer ones are set aside (reason too_long) before
    # any forward. None = the model's max_position_embeddings (from its config.json).
    max_seq_len: int | None = None
    sdcc_lambda: float = ENGINE_DEFAULTS.sdcc_lambda  # sdcc: weight λ of KL(teacher ‖ student)
    sdcc_students: str = ENGINE_DEFAULTS.sdcc_students  # sdcc: junctions | all (a student per selected call)
    sdcc_compressed_main: bool = ENGINE_DEFAULTS.sdcc_compressed_main  # sdcc: students' main loss on their own S_t
    sdcc_full_view_artifacts: bool = False  # sdcc: the full view keeps the harness's summaries/placeholders
    # radix schedule: recompute each forward's activations in the backward, keeping the cached keys/values
    # (long sessions in memory ~ tokens x K/V bytes per token; costs one more forward)
    checkpoint_chunks: bool = ENGINE_DEFAULTS.checkpoint_chunks
    # --- optimization
    steps: int = 100  # optimizer steps of the whole run
    grad_accum: int = 1  # micro-batches per rank per optimizer step
    lr: float = 1e-5  # AdamW peak learning rate
    warmup_steps: int = 0  # linear warmup to lr over this many steps
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW β1, β2
    adam_eps: float = 1e-8  # AdamW ε (update = lr·m̂/(√v̂ + ε))
    grad_clip: float | None = 1.0  # max global gradient norm; None = no clipping
    seed: int = 0  # seeds data order, sampling and torch
    # --- run
    run_dir: str = "runs/run"  # checkpoints/, final/, metrics.jsonl, tensorboard/
    resume: bool = False  # continue from run_dir's newest checkpoint (CLI: --resume)
    override_config: bool = False  # resume although result-changing fields differ (CLI: --override-config)
    save_every: int = 50  # checkpoint every this many steps (and at the end)
    keep_checkpoints: int = 2  # newest checkpoints kept
    tensorboard: bool = False  # also write run_dir/tensorboard
    wandb: bool = False  # also log to Weights & Biases (pip install "memorywalker[wandb]"), files in run_dir/wandb
    wandb_project: str = "memorywalker"  # W&B project
    wandb_mode: str = "online"  # online | offline (no network; `wandb sync` later) | disabled
    # --- adapter
    adapter: AdapterConfig = AdapterConfig()  # adapter.kind=lora: LoRA through PEFT (docs/recipes.md)
    # --- parallelism (docs/recipes.md, "Multi-GPU and sharding")
    parallel: str = "ddp"  # ddp: whole model per rank, gradients summed once per step | fsdp: FSDP2 sharding
    mixed_precision: str | None = None  # fsdp: dtype the gathered parameters compute in (bfloat16); grads reduce in fp32
    activation_checkpointing: bool = False  # fsdp: each decoder layer recomputes its activations in backward
    collective_timeout: float = 600.0  # seconds a collective may wait before the run fails, naming the cause

    def engine_config(self, objective: str) -> EngineConfig:
        """The engine configuration of this recipe's step: every field this config shares with
        :class:`~memorywalker.engine.EngineConfig` (each typed once, there, and defaulted from
        :data:`ENGINE_DEFAULTS` here: RL's clipping and rollout correction too) and the recipe's ``objective``."""
        shared = {f.name for f in dataclasses.fields(EngineConfig)} & set(type(self).model_fields)
        return EngineConfig(objective=objective, **{name: getattr(self, name) for name in shared})

    def render_options(self, **fields):
        """How this recipe renders its records (``fields``: the recipe's, e.g. ``truncated``)."""
        return RenderOptions(full_view_artifacts=self.sdcc_full_view_artifacts, **fields)

    @field_validator(*CHOICES)
    @classmethod
    def _choice(cls, v: Any, info) -> Any:
        return check_choice(info.field_name, v, CHOICES[info.field_name])

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        get_method(v)  # raises with the valid names
        return v

    @field_validator("normalization")
    @classmethod
    def _normalization(cls, v: str) -> str:
        return check_choice("normalization", v, TARGET_NORMALIZATIONS)

    @field_validator("steps", "grad_accum", "save_every", "keep_checkpoints", "max_seq_len")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise InputError("must be >= 1")
        return v

    @model_validator(mode="after")
    def _sharding(self):
        # A checkpointed radix forward recomputes the whole model inside the backward, where FSDP would
        # gather every layer again outside the agreed passes; per-layer checkpointing recomputes inside
        # each layer's own unit.
        if self.parallel == "fsdp" and self.checkpoint_chunks:
            raise InputError("parallel=fsdp with checkpoint_chunks=true is not supported; use "
                             "activation_checkpointing=true (each decoder layer recomputes inside its FSDP unit)")
        return self


C = TypeVar("C", bound=BaseModel)


def valid_keys(cls: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in cls.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += valid_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return sorted(keys)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # bare strings need no quotes: method=radix


def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"{dotted}: {p!r} is not a section")
    tree[leaf] = value


def _check_keys(cls: type[BaseModel], data: dict, prefix: str = "") -> None:
    for key, value in data.items():
        field = cls.model_fields.get(key) or cls.model_fields.get(getattr(cls, "RENAMED_KEYS", {}).get(key, ""))
        if field is None:
            raise ConfigError(f"unknown key {prefix + key!r}; valid keys: {', '.join(valid_keys(cls, prefix))}")
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            _check_keys(ann, value, f"{prefix}{key}.")


def load_config(cls: type[C], path: str | Path | None, overrides: list[str] | None = None) -> C:
    """Read ``path`` (TOML; may be None), apply ``key=value`` overrides, validate into ``cls``."""
    data: dict = {}
    if path is not None:
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, text = item.split("=", 1)
        _set(data, key.strip(), _parse_value(text.strip()))
    _check_keys(cls, data)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
