"""``asp schedule`` / ``asp simulate`` on a verl YAML: the prompts the verl run trains, no verl needed.

A verl run (``main_ppo``) plans the prompts of verl's train dataset, ``RLHFDataset`` over
``data.train_files``: prompt ids are positions in that dataset and a prompt's text is the chat
messages of ``data.prompt_key`` (:func:`.plan.prompt_set_from_dataset`). The offline commands read
the same file the same way: ``data.path`` = the train file, ``data.prompt_key`` = verl's, ids = row
positions (:data:`~asp_ascend.data.datasets.POSITION_ID_KEY`), and ``output_dir`` = where the run
keeps its schedule (``trainer.default_local_dir``/asp), so the run finds the schedule made here.
Where the positions depend on what only verl computes (a tokenizer's length filter, a random
subset, a custom dataset class) or on several files, the commands stop naming the key and the
fix: ``asp.data.path`` pointed at an export of verl's train dataset in its order, or a run of the
adapter itself (its dry run plans inside verl). ``asp.data.path`` given is read as that export.

Plain YAML (OmegaConf, no Hydra): of ``defaults:`` only the ``asp: default`` group is applied
(:mod:`asp_ascend.integrations.verl.config`); verl's own defaults that matter here are
:data:`VERL_DEFAULTS`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...data.datasets import POSITION_ID_KEY
from ...errors import ConfigError

# verl 0.9.1's ppo_trainer.yaml values of the keys read here (the composed config has them)
VERL_DEFAULTS: dict[str, Any] = {
    "data.prompt_key": "prompt",
    "data.train_max_samples": -1,
    "data.filter_overlong_prompts": False,
    "data.custom_cls.path": None,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
}
ASP_GROUP = Path(__file__).resolve().parent / "config" / "asp"


def load_verl_yaml(path: str | Path) -> dict:
    """The YAML as a plain dict, with the ``asp`` group its ``defaults:`` name merged under it."""
    from omegaconf import OmegaConf

    p = Path(path)
    try:
        conf = OmegaConf.load(p)
        defaults = OmegaConf.to_container(conf.defaults) if "defaults" in conf else []
        group = next((d["asp"] for d in defaults if isinstance(d, dict) and "asp" in d), None)
        if group is not None:
            gfile = ASP_GROUP / f"{group}.yaml"
            if not gfile.is_file():
                raise ConfigError([f"defaults: asp: {group!r}: no such group in {ASP_GROUP} (use asp: default)"],
                                  str(p))
            conf = OmegaConf.merge(OmegaConf.load(gfile), conf)
        raw = OmegaConf.to_container(conf, resolve=True) or {}
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError([f"{p}: not a readable verl YAML: {exc}"]) from None
    raw.pop("defaults", None)
    raw.pop("hydra", None)
    return raw


def _verl(raw: dict, dotted: str) -> Any:
    from .config_bridge import get

    found, val = get(raw, dotted)
    return val if found else VERL_DEFAULTS.get(dotted)


def _ours(raw: dict, overrides: list[str], key: str) -> Any:
    """Our key as the command will see it: the last ``key=value`` override, else ``asp.KEY``."""
    from .config_bridge import get

    val = get(raw, "asp." + key)[1]
    for o in overrides:
        k, eq, v = o.partition("=")
        if eq and k.lstrip("+~") == key:
            val = v.strip().strip("'\"")
            val = None if val.lower() in ("", "null", "none", "~") else val
    return val


def prompt_settings(raw: dict, overrides: list[str]) -> tuple[dict, list[str]]:
    """(our ``data.*`` keys for the prompts the run trains, problems naming the verl key and the fix)."""
    p: list[str] = []
    if _ours(raw, overrides, "data.id_key") is not None:
        p.append("asp.data.id_key cannot be read with verl: a verl run's prompt ids are positions in its train "
                 "dataset; remove asp.data.id_key (an export set as asp.data.path is read by row position)")
    data = {"prompt_key": _verl(raw, "data.prompt_key"), "id_key": POSITION_ID_KEY}
    given = _ours(raw, overrides, "data.path")
    if given:   # an export of verl's train dataset, in its order
        return {**data, "path": str(given)}, p
    files = _verl(raw, "data.train_files")
    if isinstance(files, (list, tuple)) and len(files) == 1:
        files = files[0]
    export = ("set asp.data.path to a JSONL or parquet export of verl's train dataset in its order (prompt ids are "
              "row positions), or plan inside verl: python -m asp_ascend.integrations.verl.main_ppo ... "
              "+asp.dry_run=true")
    if not files:
        p.append(f"data.train_files: not set: no prompts to plan (the built-in task is never what verl trains); "
                 f"{export}")
    elif not isinstance(files, str):
        p.append(f"data.train_files: {files!r}: verl trains these files concatenated, and asp plans one prompts "
                 f"file; concatenate them in this order into one parquet file and set data.train_files to it, or {export}")
    elif not Path(files).is_file():
        p.append(f"data.train_files: {files!r} does not exist here: the offline commands read verl's train file to "
                 f"plan the run's prompts; run where the file is, or {export}")
    for key, bad, why in (
            ("data.filter_overlong_prompts", bool, "verl drops the prompts its tokenizer makes longer than "
                                                   "data.max_prompt_length, which shifts every later position"),
            ("data.train_max_samples", lambda v: v is not None and int(v) > 0,
             "verl trains a subset of the file (random when data.shuffle)"),
            ("data.custom_cls.path", bool, "a custom dataset class decides the rows")):
        val = _verl(raw, key)
        if bad(val):
            p.append(f"{key}: {val!r}: {why}, so the file's rows are not the run's prompt positions; {export}")
    return {**data, "path": files if isinstance(files, str) else None}, p


def template_settings(path: str | Path) -> dict:
    """How the verl run tokenizes a prompt (:func:`asp_ascend.integrations.prompt_tokens.counter_for`'s keywords):
    the tokenizer of ``actor_rollout_ref.model.path``, every prompt rendered by its chat template with
    the generation prompt and ``data.apply_chat_template_kwargs`` (verl's agent loop and its length filter)."""
    kwargs = _verl(load_verl_yaml(path), "data.apply_chat_template_kwargs") or {}
    return {"model_key": "actor_rollout_ref.model.path", "template_kwargs": dict(kwargs), "always_template": True}


def translate_offline(path: str, overrides: Optional[list[str]] = None):
    """Our Config for ``asp schedule`` / ``asp simulate`` from a verl YAML (``overrides``: our keys)."""
    from .config_bridge import put, translate

    overrides = list(overrides or [])
    raw = load_verl_yaml(path)
    data, problems = prompt_settings(raw, overrides)
    if problems:
        raise ConfigError(problems, str(path))
    asp = raw.setdefault("asp", {}) if isinstance(raw.get("asp", {}), dict) else {}
    for key, val in data.items():
        put(asp, f"data.{key}", val)
    if not _verl(raw, "trainer.default_local_dir"):   # verl's default: where the run keeps asp/schedule.parquet
        put(raw, "trainer.default_local_dir",
             f"checkpoints/{_verl(raw, 'trainer.project_name')}/{_verl(raw, 'trainer.experiment_name')}")
    overrides = [o for o in overrides if o.partition("=")[0].lstrip("+~") != "data.path"]   # read above
    cfg, _ = translate(raw, overrides, source=str(path))
    return cfg
