"""Typed config schema, YAML loading with dotted overrides, validation, derived values.

Schema in code (dataclasses, one help string per field: :mod:`.schema`), values in YAML,
merged with OmegaConf (`key=value` dotted overrides: :mod:`.load`). Validation reports every
problem at once, each naming the dotted key, the bad value and the valid choices
(:mod:`.validate`). Values that follow from several keys (k after the sync rule, a run's
simulator policy name) are computed once in :mod:`.derived`.
No torch/ray/vllm imports here: ``asp --help`` and ``asp schedule`` stay fast.
"""
from .derived import (ASYNC_SYSTEM_POLICIES, lag_bound_of, membership_options, prefix_block_of, reads_forecasts,
                      regroup_heavy_of, regroup_of, stream_groups_of, summary_key, system_policy_name)
from .explicit import trained_workload_problem
from .load import build_config, describe, load_config, run_config, save_resolved, to_dict, to_yaml
from .schema import (
    CostConfig, Config, DataConfig, LengthsConfig, LoggingConfig, MindSpeedConfig, ModelConfig, PipelineConfig,
    RolloutConfig, SchedulerConfig, SimConfig, SyntheticTaskConfig, TrainConfig, VerlConfig, WeightSyncConfig,
    WorkloadConfig,
)
from .validate import parse_speculative_max_batch, parse_tail_concurrency, validate

__all__ = [
    "ASYNC_SYSTEM_POLICIES", "Config", "build_config", "CostConfig", "DataConfig", "LengthsConfig", "LoggingConfig",
    "MindSpeedConfig", "ModelConfig", "PipelineConfig", "RolloutConfig", "SchedulerConfig", "SimConfig",
    "SyntheticTaskConfig", "TrainConfig", "VerlConfig", "WeightSyncConfig", "WorkloadConfig", "describe",
    "lag_bound_of", "load_config", "membership_options", "parse_speculative_max_batch", "prefix_block_of", "parse_tail_concurrency",
    "reads_forecasts", "regroup_heavy_of",
    "regroup_of", "run_config", "stream_groups_of",
    "save_resolved", "summary_key", "system_policy_name", "to_dict", "to_yaml", "trained_workload_problem", "validate",
]
