"""A trainer checkpoint folder on disk, shared by the one-actor trainer (engines/trainer.py) and
the data-parallel ranks (engines/fsdp_rank.py), which write and read the same layout:

    config.json, model.safetensors, tokenizer files   the full (unsharded) HF weights
    optimizer.pt                                      AdamW's full state, keyed by parameter index
    rng.pt                                            torch, numpy and Python RNG states
    trainer_state.json                                {"schema_version", "version", ...}
    reference.safetensors                             the KL reference's weights (kl_coef > 0 only)

A folder is written aside and renamed when complete, so a reader never sees half of one; weights
with a non-finite value are never written (a run could not continue from them). Torch and
safetensors are imported inside the functions (this module is imported with the trainer).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

REFERENCE_FILE = "reference.safetensors"  # the KL reference's weights (kl_coef > 0)
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
STATE_FILE = "trainer_state.json"
SCHEMA_VERSION = 1


def write_checkpoint(path: str, model: Any, tokenizer: Any, opt_state: dict, state: dict,
                     model_state: dict | None = None, reference: dict | None = None) -> str:
    """The checkpoint folder at ``path``: ``model``'s HF weights (``model_state`` when the model
    itself holds only a shard; None: the model's own), ``tokenizer``, ``opt_state``, this
    process's RNG states, ``state`` (must hold ``version``) and ``reference`` when given.
    Returns ``path``. Raises FloatingPointError, writing nothing, on a non-finite weight."""
    import torch
    from safetensors.torch import save_file

    bad = [n for n, t in (model_state or model.state_dict()).items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise FloatingPointError(f"checkpoint {path} not written: non-finite values in {len(bad)} weight "
                                 f"tensor(s), e.g. {bad[0]}")
    final = Path(path)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(opt_state, tmp / OPTIMIZER_FILE)
    torch.save(rng_state(), tmp / RNG_FILE)
    if reference is not None:
        save_file({k: v.contiguous() for k, v in reference.items()}, str(tmp / REFERENCE_FILE))
    (tmp / STATE_FILE).write_text(json.dumps({"schema_version": SCHEMA_VERSION, **state}))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return str(final)


def read_optimizer(path: str | Path, map_location: Any = "cpu") -> dict:
    """The optimizer state of the checkpoint at ``path`` (keyed by parameter index)."""
    import torch

    return torch.load(Path(path) / OPTIMIZER_FILE, map_location=map_location, weights_only=False)


def restore_rng(path: str | Path) -> None:
    """This process's RNG states from the checkpoint at ``path`` (left as they are without one)."""
    import torch

    f = Path(path) / RNG_FILE
    if f.is_file():
        set_rng_state(torch.load(f, weights_only=False))


def read_version(path: str | Path) -> int:
    """The policy version the checkpoint at ``path`` holds."""
    return int(json.loads((Path(path) / STATE_FILE).read_text())["version"])


def reference_file(path: str | Path, kl_coef: float) -> Path:
    """The KL reference's file in the checkpoint at ``path``; an error naming the way on when the
    checkpoint was written without one."""
    f = Path(path) / REFERENCE_FILE
    if not f.is_file():
        raise RuntimeError(f"{path}: no {REFERENCE_FILE}, the KL reference (train.kl_coef="
                           f"{kl_coef} needs it): the checkpoint was written with "
                           "train.kl_coef=0; resume with train.kl_coef=0 or start a new run")
    return f


def indexed_optimizer_state(osd: dict, names: list[str]) -> dict:
    """A full optimizer state keyed by parameter name (FSDP's ``get_optimizer_state_dict``) keyed
    by index in ``names`` instead, as a single trainer's ``optimizer.state_dict()`` is."""
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in osd["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}


def named_optimizer_state(raw: dict, names: list[str]) -> dict:
    """The inverse of :func:`indexed_optimizer_state`."""
    return {"state": {names[int(i)]: v for i, v in raw["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in raw["param_groups"]]}


def rng_state() -> dict:
    import random

    import numpy as np
    import torch

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(st: dict) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
