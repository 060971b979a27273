"""One rank of the data-parallel trainer: a :class:`TrainerEngine` built with
:class:`FSDPLayout` (the model ``fully_shard``-ed per decoder layer and at the root, FSDP2),
held by :class:`FSDPTrainerRank`, which adds what only a rank does (joining the process group,
empty passes so collectives line up, freeing gathered parameters, gathered checkpoints). The
invariants the ranks keep together, and :class:`~asp_ascend.engines.fsdp_trainer.TrainerGroup`
that drives them, are in engines/fsdp_trainer.py."""
from __future__ import annotations

from pathlib import Path

from ..io import output_to_actor_log
from . import checkpoint_io
from ..scheduler.microbatch import plan_micro_batches, step_denominator
from .trainer import TrainerEngine

__all__ = ["DUMMY_TOKENS", "FSDPLayout", "FSDPTrainerRank", "reshard"]


DUMMY_TOKENS = 2


def _dummy_sample(pad_id: int) -> dict:
    """One pass's worth of nothing: a two-token prompt, no response (zero loss, zero gradient;
    its tokens are taken out of the step's count, its pad slots are zero)."""
    return {"prompt_ids": [pad_id] * DUMMY_TOKENS, "response_ids": [], "behav_logprobs": [], "advantage": 0.0}


def reshard(model) -> None:
    """Free the unsharded parameters a forward without backward leaves behind (FSDP2 keeps the
    root's gathered after forward, for the backward). Stale ones would otherwise be reused
    by the next forward after the shards changed (an optimizer step, a load_state_dict)."""
    from torch.distributed.fsdp import FSDPModule

    for m in (model.modules() if model is not None else []):
        if isinstance(m, FSDPModule):
            m.reshard()


def _param_names(model) -> list[str]:
    return [n for n, _ in model.named_parameters()]


class FSDPLayout:
    """The model sharded over ``world`` ranks (the ``ModelLayout`` contract of engines/layout.py).
    Built after the process group is joined (the device mesh needs it)."""
    casts_itself = True  # FSDP2's MixedPrecisionPolicy casts the parameters (see wrap)

    def __init__(self, rank: int, world: int, device_type: str):
        from torch.distributed.device_mesh import init_device_mesh

        self.rank, self.world = int(rank), int(world)
        self.mesh = init_device_mesh(device_type, (self.world,))
        self.compute_dtype = None

    def wrap(self, model, compute_dtype):
        """fully_shard each decoder layer (``model.model.layers``, Qwen2/Llama style), then the root;
        gradients are summed across ranks (each rank's loss is already divided by the global count)."""
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.compute_dtype = compute_dtype
        layers = getattr(getattr(model, "model", None), "layers", None)
        mp = (MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
              if compute_dtype != torch.float32 else MixedPrecisionPolicy())
        for m in list(layers or []) + [model]:
            fully_shard(m, mesh=self.mesh, mp_policy=mp)
            m.set_gradient_divide_factor(1.0)  # per FSDP module: sum, do not average
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        return model

    def frozen_copy(self, model, device):
        """A frozen, identically sharded copy of the current weights (pi_prox or the reference)."""
        import torch
        from transformers import AutoModelForCausalLM

        with device:  # initialised on the device (fast on GPUs); the weights come from the shards below
            copy = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
        copy = self.wrap(copy, self.compute_dtype)
        copy.load_state_dict(model.state_dict())
        return copy.eval()

    def full_weights(self, model) -> list:
        """The full HF state dict on rank 0 (on CPU); [] on the other ranks. Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return list(sd.items()) if self.rank == 0 else []


class FSDPTrainerRank:
    """One data-parallel rank. Constructed cheaply; ``connect(addr, port)`` joins the process
    group and only then builds its trainer (``self.core``: loads and shards the model; the group
    learns rank 0's address first). Every method is the single trainer's, called on every rank."""

    def __init__(self, model_dir: str, *, rank: int, world_size: int, **kw):
        output_to_actor_log()  # logging.actor_output: log -> this process's output goes to train.log
        self._args = (model_dir, kw)
        self.rank, self.world = int(rank), int(world_size)
        self.core: TrainerEngine | None = None
        self._dummies = 0   # empty passes run in the open streamed step (accumulate .. apply_step)

    # ------------------------------------------------------------------ setup
    def endpoint(self, timeout_s: float = 600.0) -> tuple[str, int]:
        """Rank 0: start the group's rendezvous store and return this node's IP and its port. The
        store binds a port the OS picks (port 0), so no other process can take it between picking
        and listening (a free port picked first and bound later raced: EADDRINUSE)."""
        import datetime

        import ray
        import torch.distributed as dist

        addr = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(addr, 0, self.world, True, timeout=datetime.timedelta(seconds=timeout_s),
                                    wait_for_workers=False)
        return addr, int(self._store.port)

    def connect(self, master_addr: str, master_port: int, timeout_s: float = 600.0) -> int:
        import datetime

        import torch.distributed as dist

        from ..platforms import get_platform

        model_dir, kw = self._args
        plat = get_platform(kw.get("platform", "cpu"))
        if plat.ray_resource:  # the actor sees its own device as index 0
            plat.set_device(0)
        if not dist.is_initialized():
            timeout = datetime.timedelta(seconds=timeout_s)
            store = getattr(self, "_store", None) or dist.TCPStore(master_addr, int(master_port), self.world,
                                                                  False, timeout=timeout)
            dist.init_process_group(plat.comm_backend, store=store, rank=self.rank, world_size=self.world,
                                    timeout=timeout)
        layout = FSDPLayout(self.rank, self.world, plat.device_type)
        self.core = TrainerEngine(model_dir, layout=layout, **kw)
        return self.rank

    def ready(self) -> int:
        return self.core.ready()

    def micro_batch_settings(self) -> tuple[str, int, int]:
        return self.core.micro_batch_settings()

    # ------------------------------------------------------------------ RL
    def begin_iteration(self, version: int, mini_batches: int) -> None:
        reshard(self.core.prox_model)  # pi_prox may be reloaded from the shards next
        self.core.begin_iteration(version, mini_batches)

    def train_step(self, samples: list[dict], denom: float | None = None,
                   micro_batches: list[list[int]] | None = None, passes: int = 0) -> dict:
        """This rank's share of one optimizer step: ``denom`` = the mini-batch's response tokens
        (all ranks), ``micro_batches`` = this rank's micro-batches (indices into ``samples``),
        ``passes`` = the micro-batch passes every rank runs (the most any rank has): the missing
        ones are empty passes over dummy samples appended to ``samples``."""
        core = self.core
        if denom is None:
            denom = step_denominator(samples, core.loss_cfg.loss_agg)
        samples, plan, dummies = self._with_passes(samples, micro_batches, passes)
        st = self._resharded(lambda: core.train_step(samples, denom, plan))
        st["tokens"] -= DUMMY_TOKENS * dummies
        st["rank"] = self.rank
        return st

    def accumulate(self, samples: list[dict], micro_batches: list[list[int]] | None = None,
                   passes: int = 0) -> dict:
        """This rank's share of part of a streamed step (the single trainer's ``accumulate``;
        ``micro_batches`` and ``passes`` as in :meth:`train_step`)."""
        samples, plan, dummies = self._with_passes(samples, micro_batches, passes)
        part = self._resharded(lambda: self.core.accumulate(samples, plan))
        self._dummies += dummies
        part["tokens"] -= DUMMY_TOKENS * dummies
        part["samples"] -= dummies
        return part

    def apply_step(self, denom: float) -> dict:
        """End the streamed step (every rank divides by the same global ``denom``)."""
        st = self._resharded(lambda: self.core.apply_step(denom))
        st["tokens"] -= DUMMY_TOKENS * self._dummies
        self._dummies = 0
        st["rank"] = self.rank
        return st

    def _with_passes(self, samples: list[dict], micro_batches: list[list[int]] | None, passes: int):
        """(``samples`` + dummies, the plan with ``passes`` micro-batches, the number of dummies)."""
        core = self.core
        if micro_batches is None:
            micro_batches = plan_micro_batches(samples, *core.micro_batch_settings()).ranks[0]
        n, dummies = len(samples), max(0, max(int(passes), 1) - len(micro_batches))
        samples = list(samples) + [_dummy_sample(core.pad_id) for _ in range(dummies)]
        return samples, [list(mb) for mb in micro_batches] + [[n + i] for i in range(dummies)], dummies

    def _resharded(self, fn):
        """``fn()`` between reshards of the policy (before) and of pi_prox and the reference (after)."""
        core = self.core
        reshard(core.model)
        out = fn()
        reshard(core.prox_model)
        reshard(core.ref_model)
        return out

    def sft(self, examples: list[tuple[list[int], list[int]]], steps: int, batch_size: int, lr: float,
            seed: int) -> list[float]:
        """The single trainer's warm start, data-parallel: every rank draws the same batch (same
        seed), trains on its slice, divides by the batch's answer tokens; returns the global losses."""
        import numpy as np
        import torch
        import torch.distributed as dist

        core = self.core
        rng = np.random.default_rng(seed)
        opt = torch.optim.AdamW(core.model.parameters(), lr=lr)
        losses = []
        reshard(core.model)
        for _ in range(steps):
            pick = rng.choice(len(examples), size=min(batch_size, len(examples)), replace=False)
            batch = [examples[i] for i in pick]
            denom = max(sum(len(a) for _, a in batch), 1)
            mine = batch[self.rank::self.world] or [([core.pad_id, core.pad_id], [])]
            ids, att = core.pad([p + a for p, a in mine])
            mask = core.response_tensor([[1.0] * len(a) for _, a in mine], [len(p) for p, _ in mine], ids.shape[1])
            logp = core.logprobs(core.model, ids, att)
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
            return self.core.sequence_logprobs(prompt_ids, response_ids)  # a collective: every rank runs it
        finally:
            reshard(self.core.model)

    # ------------------------------------------------------------------ weights
    def publish(self, version: int, transport: str = "object_store"):
        """Every rank gathers (a collective); rank 0's ticket carries the weights."""
        return self.core.publish(version, transport)

    def node_ip(self) -> str:
        return self.core.node_ip()

    def open_group(self, gen: int, world: int, port: int = 0, timeout_s: float = 300.0) -> int:
        return self.core.open_group(gen, world, port, timeout_s)

    def send_weights(self, version: int, group: dict) -> dict:
        return self.core.send_weights(version, group)

    def save_checkpoint(self, path: str, state: dict) -> str:
        """Every rank gathers; rank 0 writes the single trainer's layout into ``path``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        core = self.core
        full = dict(core.full_weights())
        osd = get_optimizer_state_dict(core.model, core.opt,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        reference = self.reference_state()
        if self.rank != 0:
            return str(path)
        return checkpoint_io.write_checkpoint(path, core.model, core.tokenizer,
                                              checkpoint_io.indexed_optimizer_state(osd, _param_names(core.model)),
                                              {"version": core.version, "devices": self.world, **state},
                                              model_state=full, reference=reference)

    def load_checkpoint(self, path: str) -> int:
        """Optimizer (rank 0 reads the full state, the ranks take their shards), version, RNG."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        core = self.core
        osd = {}
        if self.rank == 0:
            osd = checkpoint_io.named_optimizer_state(checkpoint_io.read_optimizer(path), _param_names(core.model))
        set_optimizer_state_dict(core.model, core.opt, optim_state_dict=osd,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        checkpoint_io.restore_rng(path)
        self.load_reference(Path(path))
        core.version = checkpoint_io.read_version(path)
        return core.version

    def reference_state(self) -> dict | None:
        """The reference's full weights on rank 0 (None elsewhere, or without one). Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.core.ref_model is None:
            return None
        sd = get_model_state_dict(self.core.ref_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.clone() for k, v in sd.items()} if self.rank == 0 else None

    def load_reference(self, path: Path) -> None:
        """The checkpoint's reference, sharded like the model (rank 0 reads, the ranks take shards)."""
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        core = self.core
        if core.loss_cfg.kl_coef <= 0:
            return
        f = checkpoint_io.reference_file(path, core.loss_cfg.kl_coef)
        core.ref_model = core.layout.frozen_copy(core.model, core.device)
        sd = load_file(str(f)) if self.rank == 0 else {}
        set_model_state_dict(core.ref_model, sd,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        reshard(core.ref_model)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
