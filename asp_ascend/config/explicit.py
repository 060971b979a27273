"""Keys the user set that the mode the config selects would ignore: refused when a config loads.

The user's keys are those of the YAML merged with the dotted ``key=value`` overrides, before the
schema's defaults fill the rest (:func:`user_keys`). A key whose mode reads it nowhere (a
synthetic-workload key with ``workload.type: trace``, ``train.tis_cap`` with
``train.off_policy: none``, ...) is a :class:`~asp_ascend.errors.ConfigError` naming the key, its
value, why nothing reads it and the fix, instead of a run that silently does something else than
asked. A run's own saved config loads as written (``load_config(saved=True)``: these checks do not
run); a resolved config given as a config of one's own (it lists every key of the schema, or nearly
every one when an earlier version wrote it) counts only its values off the schema's defaults as set. docs/simulator.md, "Keys a mode ignores".
"""
from __future__ import annotations

import dataclasses

from .schema import Config


def _leaves(cls, prefix: str = ""):
    for f in dataclasses.fields(cls):
        tp = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if tp is not None and dataclasses.is_dataclass(tp):
            yield from _leaves(tp, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


SCHEMA_KEYS = frozenset(_leaves(Config))


def _given(raw: dict, cls, prefix: str = ""):
    """The schema's leaf keys present in ``raw`` (unknown keys are the loader's problem)."""
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        tp = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if tp is not None and dataclasses.is_dataclass(tp):
            if isinstance(raw[f.name], dict):
                yield from _given(raw[f.name], tp, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def value_of(cfg: Config, key: str):
    """The value of dotted ``key`` in ``cfg``."""
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


# A config listing at least this share of the schema's keys is a resolved config.yaml (``save_resolved``
# writes every key); an older version's lacks the keys added since, and no hand-written config comes close
RESOLVED_SHARE = 0.9


def user_keys(raw: dict, cfg: Config) -> set[str]:
    """The dotted keys the user set: those in ``raw`` (the YAML merged with the overrides). In a
    resolved config.yaml given as a config of one's own (it lists every key of the schema, or at
    least RESOLVED_SHARE of them when an earlier version wrote it) only those off their schema
    default: the rest are the defaults a run recorded, not choices."""
    given = set(_given(raw, Config))
    if len(given) < RESOLVED_SHARE * len(SCHEMA_KEYS):
        return given
    defaults = Config()
    return {k for k in given if value_of(cfg, k) != value_of(defaults, k)}


def _shown(cfg: Config, keys) -> str:
    return ", ".join(f"{k}={value_of(cfg, k)!r}" for k in keys)


def _them(keys) -> str:
    return "that key" if len(keys) == 1 else "those keys"


# ---------------------------------------------------------------------------------------------
# asp simulate's cost model: sim.model_class and the cost.* / sim.* keys only one kind of class reads

# The cost keys a model class (sim.model_class 7b | 32b) replaces by its own figures in `asp simulate`
# (sim/costs.system_costs); the speculative-decoding keys (cost.spec_*) apply under every class.
CLASS_COST_KEYS = ("decode_a", "decode_b", "decode_c", "prefill_per_token", "train_per_token", "train_per_step",
                   "logprob_per_token", "sync_s", "sync_busy_s", "publish_s", "step_latency_s", "admit_latency_s",
                   "admit_each_s", "admit_engine_s")
# The sim keys only a model class reads (sim/costs.py): with sim.model_class custom the instance's
# coefficients, the sync time and the KV capacity come from cost.* and rollout.kv_cache_tokens.
CLASS_SIM_KEYS = ("tp_efficiency", "tp_efficiency_internode", "devices_per_node", "sync_bandwidth_gbps",
                  "sync_latency_s", "host_bandwidth_gbps")


def resolve_cost_model(cfg: Config, raw: dict, given: set[str], p: list[str]) -> None:
    """The cost model of ``asp simulate`` from the keys the user set (``given``, :func:`user_keys`),
    so that no cost key is silently ignored:

    - ``cost.*`` keys a model class replaces, set without ``sim.model_class``: the class is
      ``custom`` (the costs given are used, as ``asp schedule`` and ``asp train`` use them);
    - set with ``sim.model_class: 7b | 32b``: an error (the class would ignore them);
    - ``sim.*`` keys only a model class reads, set with ``sim.model_class: custom``: an error (custom
      takes cost.sync_s and rollout.kv_cache_tokens instead).
    """
    if cfg.sim.calibrate:
        return   # --calibrate simulates custom with the fitted costs; a cost key fills what the fit lacks
    raw_sim = raw.get("sim") if isinstance(raw.get("sim"), dict) else {}
    costs = [f"cost.{k}" for k in CLASS_COST_KEYS if f"cost.{k}" in given]
    if "model_class" not in raw_sim:    # written down, even at its default in a resolved config, it is a choice
        if costs:
            cfg.sim.model_class = "custom"
        return
    mc = cfg.sim.model_class
    if mc != "custom":
        if costs:
            p.append(f"sim.model_class: {mc} simulates with the {mc} model's own costs and ignores "
                     f"{_shown(cfg, costs)}; set sim.model_class: custom to simulate with your cost.* values (the "
                     f"others keep their cost.* defaults, the KV capacity is rollout.kv_cache_tokens), or remove "
                     f"{_them(costs)} to simulate the {mc} model")
        return
    sims = [f"sim.{k}" for k in CLASS_SIM_KEYS if f"sim.{k}" in given]
    if sims:
        p.append(f"sim.model_class: custom takes one instance's coefficients, the sync time and the KV capacity from "
                 f"cost.* and rollout.kv_cache_tokens, and ignores {_shown(cfg, sims)} (read by the 7b/32b model "
                 f"classes only); remove {_them(sims)}, or set sim.model_class: 7b or 32b")


# ---------------------------------------------------------------------------------------------
# workload.*: each workload.type reads its own keys (lengths/workloads.py)

_EVOLUTION = ("num_prompts", "epochs", "group_spread", "epoch_correlation", "drift")
WORKLOAD_KEYS = {
    "synthetic": _EVOLUTION + ("body_median", "body_sigma", "tail_fraction", "tail_alpha", "tail_scale",
                               "prompt_median", "prompt_sigma", "prompt_response_correlation"),
    # prompt_median: the prompt length of every prompt when the table has no trace_prompt_column
    "trace": _EVOLUTION + ("trace_path", "trace_column", "trace_prompt_column", "length_scale", "prompt_median"),
    "history": ("group_spread",),      # prompts, epochs and lengths are the history's (lengths.path)
    "task": ("epochs",),               # the built-in task's prompts (data.synthetic.*) and answer lengths
}
_WORKLOAD_WHAT = {"synthetic": "the heavy-tailed generator", "trace": "a length table",
                  "history": "the length history lengths.path", "task": "the built-in task's known lengths"}


def _no_effect(cfg: Config, key: str, why: str, fix: str) -> str:
    """The problem line of a key set where nothing reads it: the key, its value, why, the fix."""
    return f"{key}: {value_of(cfg, key)!r} has no effect: {why}; {fix}, or remove {key}"


# With data.path set the workload of every command is that file's prompts (lengths/workloads.py:
# asp schedule and asp train plan them, asp simulate simulates them with the lengths of lengths.path,
# each group's samples spread around its prompt's mean as a history's): workload.type history reads the
# same, and only group_spread of the workload.* keys is read.
DATASET_KEYS = ("group_spread",)


def _dataset_workload(cfg: Config, given: set[str], p: list[str]) -> None:
    why = ("data.path is set, and its prompts are the workload of every command (asp schedule and asp train plan "
           "them, asp simulate simulates them with the lengths of lengths.path)")
    for f in dataclasses.fields(cfg.workload):
        key = f"workload.{f.name}"
        if key not in given or f.name in DATASET_KEYS or (f.name == "type" and cfg.workload.type == "history"):
            continue
        p.append(_no_effect(cfg, key, why, "remove data.path (data.path=null) to use the experiment workload of "
                                           "workload.type"))


def _synthetic_tail(cfg: Config, given: set[str], p: list[str]) -> None:
    """Synthetic keys that the mix leaves unread: the tail's with no tail (tail_fraction 0) or a tail
    wholly clipped at the generation cap, the body's with no body (tail_fraction 1)."""
    w, M = cfg.workload, cfg.lengths.max_response_length
    if w.tail_fraction == 0:
        dead, why, fix = ("tail_alpha", "tail_scale"), "workload.tail_fraction is 0 (no prompt is drawn from the " \
                                                       "tail)", "set workload.tail_fraction above 0"
    elif w.tail_fraction == 1:
        dead, why, fix = ("body_median", "body_sigma"), "workload.tail_fraction is 1 (every prompt is drawn from " \
                                                         "the tail)", "set workload.tail_fraction below 1"
    elif w.tail_scale >= M:
        dead = ("tail_alpha",)
        why = (f"every tail length (workload.tail_scale={w.tail_scale:g} tokens and up) is at or above "
               f"lengths.max_response_length={M} and clipped to it, whatever the tail's shape")
        fix = f"set workload.tail_scale below {M} or raise lengths.max_response_length"
    else:
        return
    p.extend(_no_effect(cfg, f"workload.{k}", why, fix) for k in dead if f"workload.{k}" in given)


def _workload(cfg: Config, given: set[str], p: list[str]) -> None:
    if cfg.data.path:
        _dataset_workload(cfg, given, p)
        return
    wt = cfg.workload.type
    if wt == "synthetic":
        _synthetic_tail(cfg, given, p)
    what = _WORKLOAD_WHAT[wt] if "workload.type" in given else f"the default: {_WORKLOAD_WHAT[wt]}"
    for f in dataclasses.fields(cfg.workload):
        key = f"workload.{f.name}"
        if f.name == "type" or f.name in WORKLOAD_KEYS[wt] or key not in given:
            continue
        types = " or ".join(t for t, keys in WORKLOAD_KEYS.items() if f.name in keys)
        hint = " (the built-in task's prompt count is data.synthetic.num_prompts)" if f.name == "num_prompts" else ""
        p.append(_no_effect(cfg, key, f"only workload.type {types} reads it, and workload.type is {wt} ({what})",
                            f"set workload.type: {types}{hint if wt == 'task' else ''}"))


def trained_workload_problem(cfg: Config, trainer: str, trains: str, prefix: str = "") -> str | None:
    """The problem line of an experiment workload (``workload.type`` synthetic, trace or history) given to
    a training run, which trains ``trains`` and plans those prompts: only asp schedule and asp
    simulate build an experiment workload. ``prefix``: how the bridge's YAML names our keys."""
    wt = cfg.workload.type
    if wt == "task":
        return None
    return (f"{prefix}workload.type: {wt!r} has no effect in {trainer}, which trains and plans {trains}: an "
            f"experiment workload ({_WORKLOAD_WHAT[wt]}) is only planned and simulated (asp schedule, asp simulate); "
            f"remove {prefix}workload.type to train")


# ---------------------------------------------------------------------------------------------
# keys read only in one mode of another key

SPEC_KEYS = ("rollout.num_speculative_tokens", "rollout.speculative_max_batch", "cost.spec_acceptance",
             "cost.spec_draft_s", "cost.spec_draft_per_seq")


def _modes(cfg: Config, given: set[str], p: list[str]) -> None:
    r, t, pl, s = cfg.rollout, cfg.train, cfg.pipeline, cfg.sim
    if r.speculative == "none":
        p.extend(_no_effect(cfg, k, "rollout.speculative is none, and only speculative decoding reads it (vLLM's "
                                    "speculative_config in asp train, the simulator's speculating step)",
                            "set rollout.speculative (e.g. ngram)") for k in SPEC_KEYS if k in given)
    if "train.tis_cap" in given and t.off_policy == "none":
        p.append(_no_effect(cfg, "train.tis_cap", "train.off_policy is none (stale samples are trained as if "
                                                  "on-policy: no importance weight to cap)",
                            "set train.off_policy: tis (the weight truncated at the cap) or decoupled_ppo (the tokens "
                            "whose weight exceeds it masked)"))
    if "pipeline.stream_groups_start" in given and (pl.stream_groups == "off" or pl.mode == "sync"):
        why = ("pipeline.stream_groups is off" if pl.stream_groups == "off"
               else "pipeline.mode is sync (where pipeline.stream_groups auto streams nothing)")
        p.append(_no_effect(cfg, "pipeline.stream_groups_start", f"{why}, so no trainer streams groups",
                            "set pipeline.stream_groups: auto or on (with pipeline.mode: async)"))
    if "train.step_timeout_factor" in given and t.step_timeout_s == 0:
        p.append(_no_effect(cfg, "train.step_timeout_factor", "train.step_timeout_s is 0, which turns the bound on "
                                                              "a hung trainer call (a train step, a save, a publish, "
                                                              "...) off (the factor only scales it)",
                            "set train.step_timeout_s (e.g. 1800, the default)"))
    ws = cfg.weight_sync
    if "weight_sync.send_slack_s" in given and (ws.transport == "object_store"
                                                or (ws.transport == "auto" and cfg.platform == "cpu")):
        why = ("weight_sync.transport is object_store" if ws.transport == "object_store"
               else "weight_sync.transport auto is object_store on platform cpu")
        p.append(_no_effect(cfg, "weight_sync.send_slack_s", f"{why}, and only the broadcast's hung-send and "
                                                             "hung-receive bounds read it",
                            "set weight_sync.transport: broadcast"))
    if "sim.stream_groups_start" in given and not s.stream_groups:
        p.append(_no_effect(cfg, "sim.stream_groups_start", "sim.stream_groups is false, so the simulated trainers "
                                                            "stream as pipeline.stream_groups says, with "
                                                            "pipeline.stream_groups_start",
                            "set sim.stream_groups: true, or use pipeline.stream_groups_start"))


def check_user_keys(cfg: Config, raw: dict, p: list[str], skip=frozenset()) -> None:
    """Every check of the keys the user set (``raw``: the YAML merged with the overrides, before
    the defaults), but those in ``skip`` (refused already for their value): asp simulate's cost
    model (which may set ``sim.model_class`` to ``custom``), the workload's keys, the keys read
    only in one mode of another. Appends to ``p``."""
    given = user_keys(raw, cfg) - set(skip)
    resolve_cost_model(cfg, raw, given, p)
    _workload(cfg, given, p)
    _modes(cfg, given, p)
