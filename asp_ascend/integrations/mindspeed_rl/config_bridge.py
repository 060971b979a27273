"""MindSpeed-RL Hydra YAML + our ``asp:`` group -> :class:`asp_ascend.config.Config`.

MindSpeed-RL's config classes reject unknown keys (``BaseConfig.update``), so our
settings live in a top-level ``asp:`` group that MindSpeed-RL never reads. Keys both
sides need are read from MindSpeed-RL's own groups (one source of truth) and mapped by
:data:`TRANSLATION`; repeating one of them under ``asp:`` with another value is an error
naming both keys. ``actor_config`` overrides ``megatron_training`` as in MindSpeed-RL
(``MegatronConfig({**megatron_training, **actor_config})``).

No torch, no hydra, no mindspeed_rl: plain YAML (``defaults:`` is left to Hydra at run time).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from ...data.datasets import POSITION_ID_KEY
from ...errors import ConfigError
from ..train_only import train_only_problems

# our dotted key -> MindSpeed-RL dotted key (megatron_training.* also looks in actor_config first)
TRANSLATION: dict[str, str] = {
    "seed": "megatron_training.seed",
    "model.path": "megatron_training.tokenizer_name_or_path",
    "train.global_batch_size": "megatron_training.global_batch_size",
    "train.max_iterations": "megatron_training.train_iters",
    "train.checkpoint_every": "megatron_training.save_interval",
    "train.lr": "megatron_training.lr",
    "train.weight_decay": "megatron_training.weight_decay",
    "train.micro_batch_size": "megatron_training.micro_batch_size",
    "train.mini_batch_size": "rl_config.mini_batch_size",
    "train.group_size": "rl_config.n_samples_per_prompt",
    "train.clip_eps": "rl_config.clip_ratio",
    "train.kl_coef": "rl_config.init_kl_coef",
    "rollout.max_num_seqs": "generate_config.max_num_seqs",
    "rollout.devices_per_instance": "generate_config.infer_tensor_parallel_size",
    "rollout.temperature": "generate_config.sampling_config.temperature",
    "rollout.top_p": "generate_config.sampling_config.top_p",
    "lengths.max_response_length": "generate_config.sampling_config.max_tokens",
}

MINDSPEED_GROUPS = ("megatron_training", "actor_config", "rl_config", "generate_config")

# rl_config values the async adapter cannot run with: key -> (required value, why)
ASYNC_REQUIREMENTS: dict[str, tuple[Any, str]] = {
    "rl_config.use_integrated_worker": (True, "the adapter subclasses IntegratedWorker for weight push"),
    "rl_config.partial_rollout_max_split": (1, "MindSpeed-RL's partial rollout lives in its colocated generation and a "
                                               "2 x gbs TransferDock, neither of which the async path uses; use "
                                               "asp.rollout.partial_rollout: true and asp.rollout.max_split: N - 1 "
                                               "(docs/ascend.md, Partial rollout)"),
    "rl_config.data_strategy": ("td", "the off-policy correction reads and rewrites TransferDock columns"),
    "rl_config.guarantee_order": (True, "the update must take rows in the order that lays out the ASP mini-batches"),
    "rl_config.shuffle_mini_batch": (False, "a shuffle would undo the ASP mini-batches"),
}
_REQUIREMENT_DEFAULTS = {"rl_config.use_integrated_worker": False, "rl_config.partial_rollout_max_split": 1,
                         "rl_config.data_strategy": "td", "rl_config.guarantee_order": False,
                         "rl_config.shuffle_mini_batch": False}


def moe_problems(raw: dict) -> list[str]:
    """The async path serves dense models only: the receiver loads MindSpeed-RL's dense layouts
    (expert weights need the instance's expert-parallel layout and local expert count, which the
    push does not carry). Each MoE setting is refused by name."""
    out = []
    gen = raw.get("generate_config") or {}
    if gen.get("enable_expert_parallel"):
        out.append("generate_config.enable_expert_parallel: true (MoE) is not supported by mindspeed.trainer=async; "
                   "the rollout instances load dense models only. Use mindspeed.trainer=sync for MoE models")
    if int(gen.get("infer_expert_parallel_size") or 1) > 1:
        out.append(f"generate_config.infer_expert_parallel_size: {gen['infer_expert_parallel_size']} is not supported by "
                   f"mindspeed.trainer=async (dense models only); set it to 1 or use mindspeed.trainer=sync")
    name = lookup(raw, "megatron_training.model")[1]
    model = ((raw.get("model") or {}).get(name) or {}) if isinstance(name, str) else {}
    for where, val in ((f"model.{name}.num_experts", model.get("num_experts")),
                       (lookup(raw, "megatron_training.num_experts")[2], lookup(raw, "megatron_training.num_experts")[1])):
        if val:
            out.append(f"{where}: {val} experts (a MoE model) is not supported by mindspeed.trainer=async; the "
                       f"rollout instances load dense models only. Use mindspeed.trainer=sync for MoE models")
            break
    return out


EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")   # HF config.json keys of MoE models


def hf_moe_problem(model_path: Optional[str]) -> Optional[str]:
    """The model's HF ``config.json`` names experts (MoE): the async path cannot serve it. Neither push
    carries an expert layout: ``hf`` converts dense layers only, and ``resharding``'s receiver loads with
    ``InferParallelConfig(..., local_experts=0)``, which MindSpeed-RL's DeepSeek / Qwen3-MoE loaders would
    divide the experts by. None when the file is absent (the check runs again where it is read)."""
    if not model_path:
        return None
    p = Path(model_path) / "config.json"
    if not p.is_file():
        return None
    import json

    try:
        hf = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    for key in EXPERT_KEYS:
        if hf.get(key):
            return (f"{p}: {key}: {hf[key]} (a MoE model, megatron_training.tokenizer_name_or_path) is not supported by "
                    f"mindspeed.trainer=async: the rollout instances load dense models only (no expert-parallel "
                    f"layout in either weight push). Use asp.mindspeed.trainer=sync for MoE models")
    return None


def vpp_problem(raw: dict, weight_push: str) -> Optional[str]:
    """Virtual pipeline stages give a rank several model chunks; the engine-free push converts one."""
    found, val, where = lookup(raw, "megatron_training.num_layers_per_virtual_pipeline_stage")
    if not found or val in (None, 0) or weight_push != "hf":
        return None
    return (f"{where}: {val} (virtual pipeline stages: several model chunks per rank) is not supported by "
            f"asp.mindspeed.weight_push=hf, which converts one model chunk per rank; unset {where}, or set "
            f"asp.mindspeed.weight_push: resharding (MindSpeed-RL's resharding manager handles virtual pipeline "
            f"stages, at the cost of a colocated vLLM engine on every trainer rank)")


def _ours_with_overrides(ours: dict, overrides: Optional[list[str]], key: str) -> Any:
    """Our key's value as the run will see it: the last ``key=value`` override, else the ``asp:`` group's."""
    val = _get(ours, key)[1]
    for o in overrides or ():
        k, eq, v = o.partition("=")
        if eq and k.lstrip("+~") == key:
            val = v.strip().strip("'\"")
    return val


def trainer_dp(raw: dict) -> int:
    """Data-parallel size of the trainer: actor NPUs / (TP x PP x CP), as MindSpeed-RL derives it."""
    res = (raw.get("rl_config") or {}).get("actor_resource") or {}
    npus = int(res.get("num_npus", 1))
    par = 1
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        found, val, _ = lookup(raw, f"megatron_training.{key}")
        par *= int(val) if found and val else 1
    return max(1, npus // par)


def _get(raw: dict, dotted: str) -> tuple[bool, Any]:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def lookup(raw: dict, msrl_key: str) -> tuple[bool, Any, str]:
    """Value of a MindSpeed-RL key as MindSpeed-RL resolves it: (found, value, where it was found)."""
    if msrl_key.startswith("megatron_training."):
        actor_key = "actor_config." + msrl_key.split(".", 1)[1]
        found, val = _get(raw, actor_key)
        if found:
            return True, val, actor_key
    found, val = _get(raw, msrl_key)
    return found, val, msrl_key


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _set(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def load_mindspeed_yaml(path: str | Path) -> dict:
    """Read a MindSpeed-RL YAML as a plain dict (OmegaConf, interpolations resolved)."""
    from omegaconf import OmegaConf

    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"MindSpeed-RL config {p} does not exist; pass --config-path DIR --config-name NAME "
                           f"(NAME without .yaml), e.g. configs/mindspeed_rl grpo_qwen25_7b_asp_A3"])
    try:
        raw = OmegaConf.to_container(OmegaConf.load(p), resolve=True) or {}
    except Exception as exc:
        raise ConfigError([f"{p}: not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise ConfigError([f"{p}: top level must be a mapping"])
    return raw


def translate(raw: dict, overrides: Optional[list[str]] = None, source: str = "<mindspeed config>",
              *, mode: Optional[str] = None, check_files: bool = False):
    """(our Config, the MindSpeed-RL dict without ``asp:``) from one MindSpeed-RL config dict.

    ``overrides`` are our dotted ``key=value`` (applied last). Raises ConfigError listing every problem.
    """
    from ...config import load_config

    problems: list[str] = []
    missing = [g for g in ("megatron_training", "rl_config", "generate_config") if g not in raw]
    if missing:
        problems.append(f"{source}: missing group(s) {missing}; a MindSpeed-RL GRPO config has "
                        f"{list(MINDSPEED_GROUPS)} (see configs/mindspeed_rl/)")
    asp = raw.get("asp") or {}
    if not isinstance(asp, dict):
        problems.append(f"asp: must be a mapping of our config keys, got {type(asp).__name__}")
        asp = {}
    ours: dict[str, Any] = {"platform": "npu"}
    origin: dict[str, str] = {}
    for our_key, msrl_key in TRANSLATION.items():
        found, val, where = lookup(raw, msrl_key)
        if found and val is not None:
            _set(ours, our_key, val)
            origin[our_key] = where
            a_found, a_val = _get(asp, our_key)
            if a_found and a_val != val:
                problems.append(f"asp.{our_key}={a_val!r} contradicts {where}={val!r}; set it once, in {where}")
    for key, val in _flatten(asp).items():
        if key in TRANSLATION:
            continue
        _set(ours, key, val)
    id_key = _ours_with_overrides(ours, overrides, "data.id_key")
    if id_key is not None:
        problems.append(f"asp.data.id_key: {id_key!r} cannot be read: MindSpeed-RL addresses its prompts by position "
                        "in megatron_training.data_path, so a schedule's prompt_id is the row of asp.data.path; "
                        "remove asp.data.id_key (and keep that file's rows in the dataset's order)")
    _set(ours, "data.id_key", POSITION_ID_KEY)
    mode = mode or _ours_with_overrides(ours, overrides, "mindspeed.trainer") or "async"
    if mode == "async":
        for key, (want, why) in ASYNC_REQUIREMENTS.items():
            found, val = _get(raw, key)
            val = val if found else _REQUIREMENT_DEFAULTS[key]
            if val != want:
                problems.append(f"{key}: {val!r} does not work with mindspeed.trainer=async ({why}); set {key}: {want}")
        dp = trainer_dp(raw)
        gbs = lookup(raw, "megatron_training.global_batch_size")[1] or 0
        n = lookup(raw, "rl_config.n_samples_per_prompt")[1] or 1
        mb = lookup(raw, "rl_config.mini_batch_size")[1] or gbs
        if mb and mb % dp:
            problems.append(f"rl_config.mini_batch_size: {mb} prompts cannot be split over the trainer's {dp} "
                            f"data-parallel ranks; use a multiple of {dp}")
        problems.extend(moe_problems(raw))
        moe = hf_moe_problem(lookup(raw, "megatron_training.tokenizer_name_or_path")[1])
        if moe and not moe_problems(raw):
            problems.append(moe)
        vpp = vpp_problem(raw, _ours_with_overrides(ours, overrides, "mindspeed.weight_push") or "hf")
        if vpp:
            problems.append(vpp)
        if _get(asp, "rollout.partial_rollout")[1] and _get(asp, "scheduler.reestimate") == (True, False):
            problems.append("asp.rollout.partial_rollout: true needs asp.scheduler.reestimate: true (a group is carried "
                            "over when its re-estimated remaining length is past the iteration's budget; without "
                            "re-estimation nothing is ever deferred)")
        found, dispatch, _ = lookup(raw, "rl_config.actor_update_dispatch_size")
        if found and dispatch and gbs and dispatch != gbs * n // dp:
            problems.append(f"rl_config.actor_update_dispatch_size: {dispatch} must be unset or global_batch_size x "
                            f"n_samples_per_prompt / DP = {gbs * n // dp} (one row range per rank)")
    if problems:
        raise ConfigError(problems, source)
    from omegaconf import OmegaConf

    fd, tmp = tempfile.mkstemp(suffix=".yaml", prefix="asp-from-mindspeed-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(OmegaConf.to_yaml(OmegaConf.create(ours)))
        try:
            cfg = load_config(tmp, list(overrides or []), check_files=check_files)
        except ConfigError as exc:
            raise ConfigError([_name_source(p, origin) for p in exc.problems], source) from None
    finally:
        os.unlink(tmp)
    problems = train_only_problems(cfg, "MindSpeed-RL")
    if cfg.scheduler.adaptive and cfg.mindspeed.trainer != "async":
        problems.append(ADAPTIVE_PROBLEM)
    if (cfg.mindspeed.trainer == "async" and cfg.train.off_policy == "decoupled_ppo"
            and _ours_with_overrides(ours, overrides, "train.tis_cap") is not None):
        problems.append(f"asp.train.tis_cap: {cfg.train.tis_cap!r} has no effect: MindSpeed-RL's async trainer applies "
                        "the cap with train.off_policy tis only (with decoupled_ppo it weights every token by "
                        "pi_old / pi_behaviour uncapped; asp train's trainer masks the tokens above the cap); set "
                        "asp.train.off_policy: tis, or remove asp.train.tis_cap")
    if problems:
        raise ConfigError(problems, source)
    msrl = {k: v for k, v in raw.items() if k != "asp"}
    return cfg, msrl


ADAPTIVE_PROBLEM = (
    "asp.scheduler.adaptive: true is not supported with asp.mindspeed.trainer: sync (RayGRPOTrainer draws "
    "every batch from schedule.parquet as planned before training, so nothing would re-plan; the async trainer "
    "re-plans each later epoch from the lengths it observed); set asp.mindspeed.trainer: async, or "
    "asp.scheduler.adaptive: false")


def missing_prompts_problem(raw: dict, cfg) -> Optional[str]:
    """The problem line of a MindSpeed-RL config whose ASP pass has no prompts to plan: MindSpeed-RL
    trains ``megatron_training.data_path``, a Megatron indexed dataset asp cannot read without
    mindspeed_rl and megatron, so the pass plans ``asp.data.path``; absent, it would plan the
    built-in synthetic task, whose ids are not rows of that dataset. None when ``asp.data.path`` is set."""
    if cfg.data.path:
        return None
    found, val, where = lookup(raw, "megatron_training.data_path")
    what = f"{where}: {val!r} (a Megatron indexed dataset, .bin/.idx)" if found else f"{where}: not set"
    return (f"asp.data.path: not set, so the ASP pass has no prompts of this run to plan (it would plan the built-in "
            f"synthetic task, whose prompts MindSpeed-RL never trains); MindSpeed-RL trains {what}, which asp cannot "
            f"read without mindspeed_rl and megatron. Set asp.data.path to a JSONL or parquet export of the same "
            f"prompts in the same order (a 'prompt' column; prompt_id = row = the document's position in "
            f"{where}, after MindSpeed-RL's rl_config.max_prompt_length filter); docs/ascend.md, step 4")


def _name_source(problem: str, origin: dict[str, str]) -> str:
    """Point a problem with one of our keys at where the user wrote it."""
    key = problem.split(":", 1)[0].strip()
    if key in origin:
        return f"{problem} (from {origin[key]})"
    return f"asp.{problem}" if "." in key and not key.startswith(("override", "config file")) else problem


def translate_file(path: str | Path, overrides: Optional[list[str]] = None, **kw):
    return translate(load_mindspeed_yaml(path), overrides, source=str(path), **kw)
