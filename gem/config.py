"""Typed configuration: dataclasses loaded from YAML presets, overridable from the CLI.

Each stage owns a ``@dataclass(kw_only=True)`` config (nested dataclasses allowed).
A value comes, in increasing priority, from the dataclass default, a named preset
(``configs/<section>/<preset>.yaml`` inside this package), a user YAML file, and
``--set key.sub=value`` overrides (values parsed as YAML scalars).

    cfg = load_config(SimulatorConfig, preset="small", overrides=["users=1000"])

Numbers mean something: a float field takes any finite number, also written ``1e-4``
(which YAML 1.1 reads as a string), never NaN or infinity; a field declared with
``ranged(default, ge=..., gt=..., le=..., lt=...)`` is checked against its range (each
element of a list), here and by ``check_ranges`` for configs built in code.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gem.errors import UserError

PRESETS_DIR = Path(__file__).resolve().parent / "configs"

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    pass


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
RANGE = "gem.range"  # dataclass field metadata key


@dataclasses.dataclass(frozen=True)
class Range:
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def text(self) -> str:
        parts = [f"{op} {v:g}" for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                 if v is not None]
        return " and ".join(parts)

    def holds(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))


def ranged(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
           ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None) -> Any:
    """A dataclass field whose value (each element of a list) must lie in the range."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={RANGE: Range(ge=ge, gt=gt, le=le, lt=lt)})


def check_ranges(cfg: Any, where: str = "") -> Any:
    """Every ranged field of ``cfg`` (nested dataclasses too) within its range, every
    float finite; else ConfigError naming the key. Returns ``cfg``."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{where}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_ranges(value, f"{key}.")
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{key}={value!r}: must be a finite number")
            bounds = f.metadata.get(RANGE)
            if bounds is not None and isinstance(item, (int, float)) and not bounds.holds(item):
                raise ConfigError(f"{key}={value!r}: must be {bounds.text()}")
    return cfg


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
        try:
            parsed = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: a date-like value that is no date
            raise ConfigError(f"override {item!r}: not a valid value ({str(exc).splitlines()[0]})") from exc
        raw = _merge(raw, _nest(key.split("."), parsed))
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
    return check_ranges(cls(**kwargs), where)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# where a run logs, not what it does: MLflow shows a run's store and experiment itself,
# and a param naming another experiment (or a machine path) only misleads
WHERE_KEYS = ("tracking_uri", "experiment", "run_name")


def run_params(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``flatten(cfg, prefix)`` without the WHERE_KEYS: a config as MLflow params."""
    return {k: v for k, v in flatten(cfg, prefix).items() if k.rsplit(".", 1)[-1] not in WHERE_KEYS}


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
    if hint is float and isinstance(value, str) and _NUMBER.match(value.strip()):
        return float(value)  # 1e-4: YAML 1.1 reads an exponent without a dot as a string
    if hint is str and isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()  # YAML reads 2026-01-05 as a date
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a date-like value that is no date
        mark = getattr(exc, "problem_mark", None)
        at = f": line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{at}: not valid YAML ({problem})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def with_point(cfg: T, point: dict[str, Any]) -> T:
    """``cfg`` with dotted overrides applied (``{"optim.lr": 0.001}``), checked as a
    preset is: one point of a hyperparameter grid."""
    raw = to_dict(cfg)
    for key, value in point.items():
        raw = _merge(raw, _nest(key.split("."), value))
    return from_dict(type(cfg), raw)


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


# argparse types: a bad option value is a usage error naming the option (exit 2)

def iso_time(text: str) -> str:
    """An ISO-8601 time (naive = UTC), returned as given."""
    import argparse
    import datetime as dt

    try:
        dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time (e.g. 2026-01-06 or "
                                         "2026-01-06T12:00:00Z)") from None
    return text


def iso_day(text: str) -> str:
    """A day, YYYY-MM-DD."""
    import argparse
    import datetime as dt

    try:
        dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day YYYY-MM-DD (e.g. 2026-01-06)") from None
    return text


def fraction(text: str) -> float:
    """A number in [0, 1] (NaN refused)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:  # false for NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction: a number in [0, 1]")
    return value


def count(minimum: int):
    """An integer >= ``minimum``."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {minimum}")
        return value

    parse.__name__ = f"count>={minimum}"
    return parse
