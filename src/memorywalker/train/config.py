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

import json
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    pass


class RecipeConfig(BaseModel):
    """Base of every recipe config: strict (unknown fields are errors), validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


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
        return text  # bare strings need no quotes: method=tree-mask


def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"{dotted}: {p!r} is not a section")
    tree[leaf] = value


def _check_keys(cls: type[BaseModel], data: dict, prefix: str = "") -> None:
    for key, value in data.items():
        field = cls.model_fields.get(key)
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
            data = tomllib.load(f)
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
