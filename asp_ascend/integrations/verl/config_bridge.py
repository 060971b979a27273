"""verl's composed Hydra config + our ``asp:`` group -> :class:`asp_ascend.config.Config`.

verl reads its groups (``data``, ``actor_rollout_ref``, ``trainer``, ``algorithm``,
``async_training``) and never the top-level ``asp:`` group, which holds our keys (e.g.
``asp.scheduler.adaptive``, ``asp.pipeline.lag_bound``, ``asp.verl.mode``). Keys both sides
need are read from verl's groups (one source of truth, :data:`TRANSLATION`); repeating one
under ``asp:`` with another value is an error naming both keys. Settings of verl that would
undo the schedule are errors naming the verl key and the fix (:func:`unsupported`).

Works on a plain dict (``OmegaConf.to_container(cfg, resolve=True)``); no verl, no torch.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

from ...errors import ConfigError
from ..train_only import train_only_problems

# our dotted key -> verl dotted key
TRANSLATION: dict[str, str] = {
    "model.path": "actor_rollout_ref.model.path",
    "train.global_batch_size": "data.train_batch_size",
    "train.mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "train.group_size": "actor_rollout_ref.rollout.n",
    "train.epochs": "trainer.total_epochs",
    "train.lr": "actor_rollout_ref.actor.optim.lr",
    "train.clip_eps": "actor_rollout_ref.actor.clip_ratio",
    "rollout.max_num_seqs": "actor_rollout_ref.rollout.max_num_seqs",
    "rollout.devices_per_instance": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "rollout.temperature": "actor_rollout_ref.rollout.temperature",
    "rollout.top_p": "actor_rollout_ref.rollout.top_p",
    "lengths.max_response_length": "data.max_response_length",
}
MODES = ("sync", "one_step_off", "fully_async")
VERL_GROUPS = ("data", "actor_rollout_ref", "trainer", "algorithm")


def get(raw: dict, dotted: str) -> tuple[bool, Any]:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _val(raw: dict, dotted: str, default: Any = None) -> Any:
    found, v = get(raw, dotted)
    return v if found and v is not None else default


def put(d: dict, dotted: str, value: Any) -> None:
    """Set ``dotted`` (``a.b.c``) in the nested dict ``d``, making the groups on the way."""
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def rollout_instances(raw: dict) -> int:
    """verl's rollout replicas: rollout devices / (TP x DP x PP) of one replica.

    Colocated (``hybrid_engine``): the trainer's devices; separate rollout devices
    (one-step-off, fully async): ``rollout.nnodes x rollout.n_gpus_per_node``."""
    r = "actor_rollout_ref.rollout."
    if _val(raw, "actor_rollout_ref.hybrid_engine", True):
        devices = int(_val(raw, "trainer.nnodes", 1)) * int(_val(raw, "trainer.n_gpus_per_node", 1))
    else:
        devices = int(_val(raw, r + "nnodes", 0)) * int(_val(raw, r + "n_gpus_per_node", 0))
    per = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        per *= int(_val(raw, r + key, 1))
    return max(1, devices // max(1, per))


def prompts_per_version(raw: dict) -> int:
    """Fully async: prompts trained per parameter version (verl's ``required_samples x
    trigger_parameter_sync_step``), the ASP iteration of that mode."""
    a = raw.get("async_training") or {}
    return (int(_val(raw, "actor_rollout_ref.actor.ppo_mini_batch_size", 1)) * int(a.get("require_batches", 1))
            * int(a.get("trigger_parameter_sync_step", 1)))


def unsupported(raw: dict, mode: str, lag_bound: int) -> list[str]:
    """Every verl setting that would undo the schedule in ``mode``, each naming the key and the fix."""
    p: list[str] = []
    act = "actor_rollout_ref.actor."
    if _val(raw, "trainer.balance_batch", False) and mode != "fully_async":
        p.append("trainer.balance_batch: true reorders the batch across DP ranks and mini-batches, undoing the "
                 "schedule's mini-batches; set trainer.balance_batch=false (ASP's mini-batches are length-homogeneous)")
    if _val(raw, act + "shuffle", False):
        p.append(f"{act}shuffle: true shuffles rows inside verl's update; set {act}shuffle=false")
    if _val(raw, "algorithm.filter_groups.enable", False):
        p.append("algorithm.filter_groups.enable: true (dynamic sampling) draws extra batches, so one verl batch is "
                 "no longer one ASP iteration; set algorithm.filter_groups.enable=false")
    if mode == "sync" and _val(raw, "trainer.use_v1", False):
        p.append("trainer.use_v1: true runs the V1 trainer, which builds its sampler inside (no train_sampler); "
                 "set trainer.use_v1=false (RayPPOTrainer) for asp.verl.mode=sync")
    gbs = int(_val(raw, "data.train_batch_size", 0) or 0)
    mb = int(_val(raw, act + "ppo_mini_batch_size", 0) or 0)
    if mode != "fully_async":
        gen = _val(raw, "data.gen_batch_size")
        if gen is not None and int(gen) != gbs:
            p.append(f"data.gen_batch_size: {gen} != data.train_batch_size {gbs}; one verl batch must be one ASP "
                     f"iteration, unset data.gen_batch_size")
        if gbs and mb and gbs % mb:
            p.append(f"{act}ppo_mini_batch_size: {mb} does not divide data.train_batch_size {gbs}")
    else:
        theta = float(_val(raw, "async_training.staleness_threshold", 0.0))
        if theta < lag_bound:
            p.append(f"async_training.staleness_threshold: {theta:g} lets verl pause generation before ASP's lag "
                     f"bound k={lag_bound} does (verl allows (1 + threshold) versions of samples in flight); set it "
                     f">= {lag_bound} or lower asp.pipeline.lag_bound")
        _, route = get(raw, "asp.verl.route_servers")
        if _val(raw, "async_training.use_dynamic_resource_scheduling", False) and route is not False:
            p.append("async_training.use_dynamic_resource_scheduling: true adds hybrid rollout servers the schedule has "
                     "no instance for (guided routing never sends ASP groups there); set it false, or "
                     "asp.verl.route_servers=false to keep verl's least-loaded routing")
    # tail mechanisms of DESIGN 9 that verl's engines do not run: planned or set, they would silently not happen
    for key, off, why in (("rollout.tail_concurrency", "off", "verl's servers take no per-instance admission cap"),
                          ("rollout.speculative", "none", "set speculative decoding in verl's own rollout engine "
                                                          "arguments instead"),
                          ("rollout.partial_rollout", "false", "ASP's carry-over is not mapped; verl's own partial "
                                                               "rollout is async_training.partial_rollout (fully async)")):
        found, v = get(raw, "asp." + key)
        if found and v is not None and str(v).lower() not in (off, "false", "off", "none"):
            p.append(f"asp.{key}: {v!r} is not available inside verl ({why}); set asp.{key}={off}")
    return p


def translate(raw: dict, overrides: Optional[list[str]] = None, source: str = "<verl config>",
              *, check_files: bool = False):
    """(our Config, verl's dict without ``asp:``). ``overrides``: our dotted ``key=value``, applied last.
    Raises ConfigError listing every problem."""
    problems: list[str] = []
    missing = [g for g in VERL_GROUPS if g not in raw]
    if missing:
        problems.append(f"{source}: missing group(s) {missing}; compose a verl config (defaults: [ppo_trainer, "
                        f"_self_]; configs/verl/)")
    asp = raw.get("asp") or {}
    if not isinstance(asp, dict):
        problems.append(f"asp: must be a mapping of our config keys, got {type(asp).__name__}")
        asp = {}
    mode = _get_mode(asp, overrides)
    if mode not in MODES:
        problems.append(f"asp.verl.mode: unknown value {mode!r}; choose one of {', '.join(MODES)}")
    ours: dict[str, Any] = {"platform": _platform(raw)}
    origin: dict[str, str] = {}
    for our_key, verl_key in TRANSLATION.items():
        found, val = get(raw, verl_key)
        if mode == "fully_async" and our_key == "train.global_batch_size":
            found, val, verl_key = True, prompts_per_version(raw), "async_training.require_batches x trigger_parameter_sync_step x ppo_mini_batch_size"
        if found and val is not None:
            put(ours, our_key, val)
            origin[our_key] = verl_key
            a_found, a_val = get(asp, our_key)
            if a_found and a_val != val:
                problems.append(f"asp.{our_key}={a_val!r} contradicts {verl_key}={val!r}; set it once, in {verl_key}")
    if _val(raw, "actor_rollout_ref.actor.use_kl_loss", False):
        put(ours, "train.kl_coef", _val(raw, "actor_rollout_ref.actor.kl_loss_coef", 0.0))
    put(ours, "rollout.num_instances", rollout_instances(raw))
    seed = _val(raw, "data.seed")
    if seed is not None:
        put(ours, "seed", seed)
    default_out = _val(raw, "trainer.default_local_dir")
    if default_out:
        put(ours, "output_dir", os.path.join(str(default_out), "asp"))
    for key, val in _flatten(asp).items():
        if key not in TRANSLATION:
            put(ours, key, val)
    k = {"sync": 0, "one_step_off": 1}.get(mode)
    if k is not None:
        a_found, a_k = get(asp, "pipeline.lag_bound")
        if a_found and a_k != k:
            problems.append(f"asp.pipeline.lag_bound={a_k} contradicts asp.verl.mode={mode} (lag {k} by "
                            f"construction); drop asp.pipeline.lag_bound")
        put(ours, "pipeline.mode", "sync" if k == 0 else "async")
        put(ours, "pipeline.lag_bound", max(k, 1))
    if mode in MODES:
        lag = k if k is not None else int(get(asp, "pipeline.lag_bound")[1] or 1)
        problems.extend(unsupported(raw, mode, lag))
    router = _val(raw, "actor_rollout_ref.rollout.router_config_path")
    if router and get(asp, "verl.route_servers")[1] is not False:
        problems.append(f"actor_rollout_ref.rollout.router_config_path: {router} replaces verl's load balancer, "
                        f"and so does ASP's guided server choice; unset it, or set asp.verl.route_servers=false")
    if problems:
        raise ConfigError(problems, source)
    cfg = _load(ours, overrides, check_files, origin, source)
    problems = train_only_problems(cfg, "verl")
    if problems:
        raise ConfigError(problems, source)
    return cfg, {key: v for key, v in raw.items() if key != "asp"}


def _get_mode(asp: dict, overrides: Optional[list[str]]) -> str:
    for o in overrides or []:
        if o.startswith("verl.mode="):
            return o.split("=", 1)[1]
    return str(get(asp, "verl.mode")[1] or "sync")


def _platform(raw: dict) -> str:
    dev = str(_val(raw, "trainer.device", "cuda"))
    return {"npu": "npu", "cuda": "cuda", "cpu": "cpu"}.get(dev, "auto")


def _load(ours: dict, overrides, check_files: bool, origin: dict, source: str):
    from omegaconf import OmegaConf

    from ...config import load_config

    fd, tmp = tempfile.mkstemp(suffix=".yaml", prefix="asp-from-verl-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(OmegaConf.to_yaml(OmegaConf.create(ours)))
        try:
            return load_config(tmp, list(overrides or []), check_files=check_files)
        except ConfigError as exc:
            raise ConfigError([_name_source(p, origin) for p in exc.problems], source) from None
    finally:
        os.unlink(tmp)


def _name_source(problem: str, origin: dict[str, str]) -> str:
    key = problem.split(":", 1)[0].strip()
    if key in origin:
        return f"{problem} (from {origin[key]})"
    return f"asp.{problem}" if "." in key and not key.startswith(("override", "config file")) else problem
