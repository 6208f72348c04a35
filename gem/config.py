"""Typed configuration: dataclasses loaded from YAML presets, overridable from the CLI.

Each stage owns a ``@dataclass(kw_only=True)`` config (nested dataclasses allowed).
A value comes, in increasing priority, from the dataclass default, a named preset
(``configs/<section>/<preset>.yaml`` inside this package), a user YAML file, and
``--set key.sub=value`` overrides (values parsed as YAML scalars).

    cfg = load_config(SimulatorConfig, preset="small", overrides=["users=1000"])
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

PRESETS_DIR = Path(__file__).resolve().parent / "configs"

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def preset_names(section: str) -> list[str]:
    return sorted(p.stem for p in (PRESETS_DIR / section).glob("*.yaml"))


def load_config(cls: type[T], *, section: str | None = None, preset: str | None = None,
                path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build ``cls`` from defaults < preset < YAML file < overrides."""
    raw: dict[str, Any] = {}
    if preset:
        if not section:
            raise ConfigError(f"preset {preset!r} given without a config section")
        preset_path = PRESETS_DIR / section / f"{preset}.yaml"
        if not preset_path.is_file():
            raise ConfigError(
                f"unknown {section} preset {preset!r}; choose one of {preset_names(section)}"
            )
        raw = _merge(raw, _read_yaml(preset_path))
    if path:
        raw = _merge(raw, _read_yaml(Path(path)))
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        raw = _merge(raw, _nest(key.split("."), yaml.safe_load(value)))
    return from_dict(cls, raw)


def from_dict(cls: type[T], raw: dict[str, Any], where: str = "") -> T:
    """Instantiate a (nested) dataclass, rejecting unknown keys with the full key path."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {raw!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"{where or cls.__name__}: unknown key(s) {unknown}; known keys are {sorted(known)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in raw.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}{name}")
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": 1}`` form, e.g. for MLflow params."""
    out: dict[str, Any] = {}
    for key, value in (to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_dict(hint, value, f"{where}.")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, where) if len(args) == 1 else value
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        (arg, *_) = typing.get_args(hint) or (Any,)
        items = [_coerce(arg, v, where) for v in value]
        return tuple(items) if origin is tuple else items
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def _nest(keys: list[str], value: Any) -> dict[str, Any]:
    return {keys[0]: value} if len(keys) == 1 else {keys[0]: _nest(keys[1:], value)}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
