"""YAML loading with dotted ``key=value`` overrides, conversion into the schema, writing back.

Values in YAML are merged with OmegaConf; each is converted to its field's type and checked
against its choices, then :func:`.validate.validate` runs the cross-field checks. Every
problem is collected and raised at once as one :class:`~asp_ascend.errors.ConfigError`.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError
from .schema import Config
from .explicit import check_user_keys
from .validate import validate


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                *, check_files: bool = True, saved: bool = False) -> Config:
    """Load YAML (optional), apply dotted ``key=value`` overrides, convert and validate.

    The keys set decide ``asp simulate``'s cost model (:func:`.explicit.resolve_cost_model`: cost
    keys without ``sim.model_class`` imply ``custom``; with 7b/32b they are an error), and a key
    set that the mode the config selects would ignore is an error (:mod:`.explicit`). ``saved``: a
    config a run wrote (its resolved config.yaml, or the dict of a loaded config), taken as it
    is: its cost keys were what the run's planner used whatever its ``sim.model_class``, and it
    lists every key whatever its mode.
    Raises :class:`ConfigError` listing every problem at once.
    """
    from omegaconf import OmegaConf

    source = str(path) if path else "<defaults>"
    problems: list[str] = []
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError([f"config file {p} does not exist: pass the path of a YAML file, e.g. configs/cpu_tiny_grpo.yaml"])
        try:
            raw = OmegaConf.to_container(OmegaConf.load(p), resolve=True) or {}
        except Exception as exc:  # yaml syntax errors carry line/column
            raise ConfigError([f"{p}: not valid YAML: {exc}"], source) from None
        if not isinstance(raw, dict):
            raise ConfigError([f"{p}: top level must be a mapping of keys, got {type(raw).__name__}"], source)
        raw.pop("defaults", None)
    merged = OmegaConf.create(raw)
    for o in overrides:
        key, sep, _ = o.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {o!r}: expected key=value, e.g. rollout.num_instances=4")
            continue
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([o]))
        except Exception as exc:  # omegaconf and yaml errors alike
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            problems.append(f"override {o!r}: cannot parse ({first}); quote strings, e.g. key='a b'")
    try:
        raw = OmegaConf.to_container(merged, resolve=True)
    except Exception as exc:
        problems.append(f"{source}: cannot resolve interpolations ({str(exc).splitlines()[0]})")
        raw = OmegaConf.to_container(merged, resolve=False)
    cfg = _build(Config, raw, "", problems)
    # Cross-field checks run even when some keys were bad (those keep defaults), so
    # the user sees every problem in one go.
    problems.extend(validate(cfg, check_files=check_files))
    if not saved:   # a key already refused for its value is not also told it has no effect
        check_user_keys(cfg, raw if isinstance(raw, dict) else {}, problems,
                        skip={m.split(":", 1)[0] for m in problems})
    if problems:
        raise ConfigError(problems, source)
    return cfg


def build_config(raw: dict, problems: list[str]) -> Config:
    """A :class:`Config` from a nested dict of values (dotted keys as nested mappings); every
    unknown key or bad value is appended to ``problems`` (it then keeps its default). No
    cross-field checks: call :func:`.validate.validate` on the result."""
    return _build(Config, raw, "", problems)


def run_config(run_dir: str | Path) -> Config:
    """A run directory's resolved ``config.yaml`` read through the schema (so a key the file
    lacks takes the schema's default, as it did in the run); the defaults when there is none."""
    p = Path(run_dir) / "config.yaml"
    return load_config(p if p.is_file() else None, check_files=False, saved=True)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _build(cls, raw: Any, prefix: str, problems: list[str]):
    """Convert a nested dict into dataclass ``cls``, collecting every problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{prefix.rstrip('.') or '<root>'}: expected a mapping, got {raw!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(fields)}"
            problems.append(f"{prefix}{key}: unknown key{hint}")
    kwargs = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        tp = hints[name]
        key = prefix + name
        val = raw[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, val, key + ".", problems)
            continue
        if isinstance(val, bool) and f.metadata.get("yaml_bool"):
            val = "on" if val else "off"      # YAML 1.1 reads a bare off/on as a boolean
        ok, conv = _coerce(tp, val)
        if not ok:
            problems.append(_bad_value(key, val, tp, f.default))
            continue
        choices = f.metadata.get("choices")
        if choices and conv is not None and conv not in choices and not (name == "reward" and ":" in str(conv)):
            problems.append(f"{key}: {conv!r} is not one of {', '.join(map(str, choices))}")
            continue
        kwargs[name] = conv
    return cls(**kwargs)


def _bad_value(key: str, val, tp, default) -> str:
    """The problem line for a value of the wrong type, with the syntax that works."""
    base = _strip_optional(tp)
    if val is None:
        shown = f", e.g. {key}={default}" if default is not dataclasses.MISSING and default is not None else ""
        return f"{key}: empty; give it a value{shown} (or leave the key out for its default)"
    if base is list or typing.get_origin(base) is list:
        return (f"{key}: {val!r} is not a list; write a list in brackets, e.g. {key}=[{val}] or {key}=[a,b] "
                f"(in a shell, quote it: '{key}=[a,b]')")
    return f"{key}: {val!r} is not a valid {_type_name(base)}"


def _strip_optional(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _coerce(tp, val):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if val is None and type(None) in typing.get_args(tp):
            return True, None
        return _coerce(_strip_optional(tp), val)
    if tp is bool:
        if isinstance(val, bool):
            return True, val
        if isinstance(val, str) and val.lower() in ("true", "false"):
            return True, val.lower() == "true"
        return False, None
    if tp is int:
        if isinstance(val, bool):
            return False, None
        if isinstance(val, int):
            return True, val
        if isinstance(val, float) and val.is_integer():
            return True, int(val)
        return False, None
    if tp is float:
        if isinstance(val, bool):
            return False, None
        if isinstance(val, (int, float)):
            return True, float(val)
        return False, None
    if tp is str:
        if isinstance(val, (str, int, float)) and not isinstance(val, bool):
            return True, str(val)
        return False, None
    if tp is list or origin is list:
        return (True, list(val)) if isinstance(val, (list, tuple)) else (False, None)
    if origin is Literal:
        return (True, val) if val in typing.get_args(tp) else (False, None)
    return True, val


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


def save_resolved(cfg: Config, output_dir: str | Path | None = None) -> Path:
    """Write the resolved config as ``config.yaml`` into the run directory (atomically)."""
    from ..io import write_text_atomic

    out = Path(output_dir or cfg.output_dir)
    path = out / "config.yaml"
    write_text_atomic(path, to_yaml(cfg))
    return path


def describe(cls=Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field: used by ``asp config``."""
    out = []
    inst = cls()
    for f in dataclasses.fields(cls):
        val = getattr(inst, f.name)
        if dataclasses.is_dataclass(val):
            out.extend(describe(type(val), prefix + f.name + "."))
        else:
            h = f.metadata.get("help", "")
            if f.metadata.get("choices"):
                h += f" ({'|'.join(f.metadata['choices'])})"
            out.append((prefix + f.name, val, h))
    return out
