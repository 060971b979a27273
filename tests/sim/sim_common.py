"""Helpers shared by the simulator tests (importable: tests/sim/conftest.py puts this folder on sys.path)."""
from asp_ascend.config import load_config

SMALL_SYNTHETIC = {"workload.type": "synthetic", "workload.epochs": 2, "lengths.max_response_length": 2048,
                   "workload.body_median": 150, "workload.tail_scale": 500, "train.group_size": 4,
                   "train.micro_batch_size": 4, "rollout.max_num_seqs": 16, "sim.total_devices": 6,
                   "sim.rollout_devices": 3, "sim.infer_tp": 1, "sim.epochs": 1, "sim.model_class": "custom"}


def small_sim_config(seed: int, **over):
    """A small synthetic heavy-tail simulation (3 single-device instances, G = 4, 16 sequences each)
    with ``over`` (dotted keys) on top, for property tests over random settings."""
    keys = {"seed": seed, **SMALL_SYNTHETIC, **over}
    return load_config(None, [f"{k}={v}" for k, v in keys.items()])
