"""Where the trained model lives: the layout a :class:`~asp_ascend.engines.trainer.TrainerEngine`
is built with. :class:`Replicated` (one process, the model whole) is the default; a
data-parallel rank passes ``FSDPLayout`` (engines/fsdp_rank.py, the model sharded with FSDP2).

The contract (``ModelLayout``): ``wrap`` the model the optimizer trains, make a
``frozen_copy`` of it laid out alike (pi_prox, the KL reference), gather its ``full_weights``
as (HF name, tensor) pairs (a sharded layout: a collective; ranks other than 0 get []);
``casts_itself``: the layout runs forward/backward in the compute dtype itself, so the trainer
adds no autocast."""
from __future__ import annotations

import copy
from typing import Protocol

__all__ = ["ModelLayout", "Replicated"]


class ModelLayout(Protocol):
    casts_itself: bool

    def wrap(self, model, compute_dtype): ...

    def frozen_copy(self, model, device): ...

    def full_weights(self, model) -> list: ...


class Replicated:
    """The whole model in this process; autocast in the compute dtype."""
    casts_itself = False

    def wrap(self, model, compute_dtype):
        return model

    def frozen_copy(self, model, device):
        return copy.deepcopy(model).eval()

    def full_weights(self, model) -> list:
        return list(model.state_dict().items())
