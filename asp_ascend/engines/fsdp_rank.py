"""One rank of the data-parallel trainer: a :class:`TrainerEngine` whose model is
``fully_shard``-ed per decoder layer and at the root (FSDP2). The invariants the ranks keep
together, and :class:`~asp_ascend.engines.fsdp_trainer.TrainerGroup` that drives them, are in
engines/fsdp_trainer.py."""
from __future__ import annotations

from pathlib import Path

from . import checkpoint_io
from .trainer import TrainerEngine

__all__ = ["DUMMY_TOKENS", "FSDPTrainerRank"]


DUMMY_TOKENS = 2


def _dummy_sample(pad_id: int) -> dict:
    """One pass's worth of nothing: a two-token prompt, no response (zero loss, zero gradient;
    its tokens are taken out of the step's count, its pad slots are zero)."""
    return {"prompt_ids": [pad_id] * DUMMY_TOKENS, "response_ids": [], "behav_logprobs": [], "advantage": 0.0}


class FSDPTrainerRank(TrainerEngine):
    """One data-parallel rank. Constructed cheaply; ``connect(addr, port)`` joins the process
    group and only then loads and shards the model (the group learns rank 0's address first)."""

    def __init__(self, model_dir: str, *, rank: int, world_size: int, **kw):
        self._args = (model_dir, kw)
        self.rank, self.world = int(rank), int(world_size)
        self._passes = 0
        self._dummies = 0

    # ------------------------------------------------------------------ setup
    def endpoint(self) -> tuple[str, int]:
        """This node's IP and a free TCP port (rank 0: the group's rendezvous)."""
        return self.node_ip(), self.free_port()

    def connect(self, master_addr: str, master_port: int, timeout_s: float = 600.0) -> int:
        import datetime

        import torch.distributed as dist

        from ..platforms import get_platform

        model_dir, kw = self._args
        plat = get_platform(kw.get("platform", "cpu"))
        if plat.ray_resource:  # the actor sees its own device as index 0
            plat.set_device(0)
        if not dist.is_initialized():
            dist.init_process_group(plat.comm_backend, init_method=f"tcp://{master_addr}:{int(master_port)}",
                                    rank=self.rank, world_size=self.world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        TrainerEngine.__init__(self, model_dir, **kw)
        return self.rank

    def _mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        if getattr(self, "_mesh_obj", None) is None:
            self._mesh_obj = init_device_mesh(self.platform.device_type, (self.world,))
        return self._mesh_obj

    def _autocast(self):
        """FSDP2's mixed-precision policy casts the parameters itself (see _wrap_model)."""
        import contextlib

        return contextlib.nullcontext()

    def _wrap_model(self, model):
        """fully_shard each decoder layer (``model.model.layers``, Qwen2/Llama style), then the root;
        gradients are summed across ranks (each rank's loss is already divided by the global count)."""
        from torch.distributed.fsdp import fully_shard

        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mesh = self._mesh()
        layers = getattr(getattr(model, "model", None), "layers", None)
        mp = (MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
              if self.compute_dtype != torch.float32 else MixedPrecisionPolicy())
        for m in list(layers or []) + [model]:
            fully_shard(m, mesh=mesh, mp_policy=mp)
            m.set_gradient_divide_factor(1.0)  # per FSDP module: sum, do not average
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        return model

    @staticmethod
    def _reshard(model) -> None:
        """Free the unsharded parameters a forward without backward leaves behind (FSDP2 keeps the
        root's gathered after forward, for the backward). Stale ones would otherwise be reused
        by the next forward after the shards changed (an optimizer step, a load_state_dict)."""
        from torch.distributed.fsdp import FSDPModule

        for m in (model.modules() if model is not None else []):
            if isinstance(m, FSDPModule):
                m.reshard()

    def _sharded_copy(self):
        """A frozen, identically sharded copy of the current weights (pi_prox or the reference)."""
        import torch
        from transformers import AutoModelForCausalLM

        with self.device:  # initialised on the device (fast on GPUs); the weights come from the shards below
            copy = AutoModelForCausalLM.from_config(self.model.config, dtype=torch.float32)
        copy = self._wrap_model(copy)
        copy.load_state_dict(self.model.state_dict())
        return copy.eval()

    # ------------------------------------------------------------------ RL
    def begin_iteration(self, version: int, mini_batches: int) -> None:
        self.version = version
        self._steps_in_iteration = 0
        if self.loss_cfg.kl_coef > 0 and self.ref_model is None:
            self.ref_model = self._sharded_copy()
        if self.loss_cfg.off_policy != "none" and mini_batches > 1:
            if self.prox_model is None:
                self.prox_model = self._sharded_copy()
            else:
                self._reshard(self.prox_model)
                self.prox_model.load_state_dict(self.model.state_dict())

    def _micro_batches(self, samples: list[dict], plan: list[list[int]] | None = None) -> list[list[dict]]:
        mbs = super()._micro_batches(samples, plan)
        self._dummies = max(0, self._passes - len(mbs))
        return mbs + [[_dummy_sample(self.pad_id)] for _ in range(self._dummies)]

    def train_step(self, samples: list[dict], denom: float | None = None,
                   micro_batches: list[list[int]] | None = None, passes: int = 0) -> dict:
        """This rank's share of one optimizer step: ``denom`` = the mini-batch's response tokens
        (all ranks), ``micro_batches`` = this rank's micro-batches (indices into ``samples``),
        ``passes`` = the micro-batch passes every rank runs (the most any rank has)."""
        self._passes = max(int(passes), 1)
        self._reshard(self.model)
        st = super().train_step(samples, denom, micro_batches)
        self._reshard(self.prox_model)
        self._reshard(self.ref_model)
        st["tokens"] -= DUMMY_TOKENS * self._dummies
        st["rank"] = self.rank
        return st

    def sft(self, examples: list[tuple[list[int], list[int]]], steps: int, batch_size: int, lr: float,
            seed: int) -> list[float]:
        """The single trainer's warm start, data-parallel: every rank draws the same batch (same
        seed), trains on its slice, divides by the batch's answer tokens; returns the global losses."""
        import numpy as np
        import torch
        import torch.distributed as dist

        rng = np.random.default_rng(seed)
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        losses = []
        self._reshard(self.model)
        for _ in range(steps):
            pick = rng.choice(len(examples), size=min(batch_size, len(examples)), replace=False)
            batch = [examples[i] for i in pick]
            denom = max(sum(len(a) for _, a in batch), 1)
            mine = batch[self.rank::self.world] or [([self.pad_id, self.pad_id], [])]
            ids, att = self._pad([p + a for p, a in mine])
            mask = self._response_tensor([[1.0] * len(a) for _, a in mine], [len(p) for p, _ in mine], ids.shape[1])
            logp = self._logprobs(self.model, ids, att)
            loss = -(logp * mask).sum() / denom
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total))
        return losses

    def sequence_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        try:
            return super().sequence_logprobs(prompt_ids, response_ids)  # a collective: every rank runs it
        finally:
            self._reshard(self.model)

    # ------------------------------------------------------------------ weights
    def _named_weights(self) -> list:
        """The full HF state dict on rank 0 (on CPU); [] on the other ranks. Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return list(sd.items()) if self.rank == 0 else []

    def _param_names(self) -> list[str]:
        return [n for n, _ in self.model.named_parameters()]

    def save_checkpoint(self, path: str, state: dict) -> str:
        """Every rank gathers; rank 0 writes the single trainer's layout into ``path``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = dict(self._named_weights())
        osd = get_optimizer_state_dict(self.model, self.opt,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        reference = self.reference_state()
        if self.rank != 0:
            return str(path)
        return checkpoint_io.write_checkpoint(path, self.model, self.tokenizer,
                                              checkpoint_io.indexed_optimizer_state(osd, self._param_names()),
                                              {"version": self.version, "devices": self.world, **state},
                                              model_state=full, reference=reference)

    def load_checkpoint(self, path: str) -> int:
        """Optimizer (rank 0 reads the full state, the ranks take their shards), version, RNG."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        osd = {}
        if self.rank == 0:
            osd = checkpoint_io.named_optimizer_state(checkpoint_io.read_optimizer(path), self._param_names())
        set_optimizer_state_dict(self.model, self.opt, optim_state_dict=osd,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        checkpoint_io.restore_rng(path)
        self.load_reference(Path(path))
        self.version = checkpoint_io.read_version(path)
        return self.version

    def reference_state(self) -> dict | None:
        """The reference's full weights on rank 0 (None elsewhere, or without one). Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.ref_model is None:
            return None
        sd = get_model_state_dict(self.ref_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.clone() for k, v in sd.items()} if self.rank == 0 else None

    def load_reference(self, path: Path) -> None:
        """The checkpoint's reference, sharded like the model (rank 0 reads, the ranks take shards)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self.loss_cfg.kl_coef <= 0:
            return
        f = checkpoint_io.reference_file(path, self.loss_cfg.kl_coef)
        self.ref_model = self._sharded_copy()
        sd = load_file(str(f)) if self.rank == 0 else {}
        set_model_state_dict(self.ref_model, sd,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        self._reshard(self.ref_model)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
