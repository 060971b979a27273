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


def reference_decode_step(cm, running: list, C: int, gen: list, L, fin, t: float) -> tuple[float, int]:
    """One decode step of a step-by-step reference instance (the token-by-token checks of the
    engine's closed-form jumps): every ``running`` sequence (together holding ``C`` KV tokens)
    computes one token at ``cm``'s decode cost (no sequence: the step costs nothing); those that
    reach their length ``L`` leave ``running``, finishing (``fin``) at the step's end. Returns the
    time after the step and how many finished."""
    n = len(running)
    if n:
        t += cm.decode_a + cm.decode_b * (C + n) + cm.decode_c * n
    for s in running:
        gen[s] += 1
    finished = [s for s in running if gen[s] >= L[s]]
    for s in finished:
        running.remove(s)
        fin[s] = t
    return t, len(finished)
