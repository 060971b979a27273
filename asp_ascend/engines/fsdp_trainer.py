"""A data-parallel trainer: ``train.devices`` ranks, the model sharded with FSDP2.

:class:`FSDPTrainerRank` is one rank (it holds a :class:`TrainerEngine` built with
``FSDPLayout``: the model ``fully_shard``-ed per decoder layer and at the root, over the
platform's collective backend: gloo on CPU, nccl on CUDA, hccl on NPU). :class:`TrainerGroup` starts the ranks as
Ray actors and offers the single trainer actor's call surface (``group.train_step.remote(...)``
returns one ObjectRef), so the orchestrator and ``asp train`` drive either the same way.

Invariants (each checked by tests/runtime/test_fsdp_trainer.py):

- **Same step as one trainer.** The group plans the mini-batch's micro-batches for all ranks
  at once (scheduler/microbatch.py with ``world`` ranks: the same token budget and mode as one
  trainer; every rank gets the same number of micro-batches, Karmarkar-Karp-balanced so their
  token slots differ by at most one micro-batch's spread, one sequence when packed). Every rank
  divides its loss by the mini-batch's GLOBAL response-token count and gradients are summed
  across ranks (divide factor 1), so the update equals one trainer's on the whole mini-batch
  (same AdamW, same clip at the global norm), up to float reduction order.
- **Collectives line up.** Every forward/backward of a sharded model is a collective, so every
  rank runs the same number of micro-batch passes (only when a step has fewer sequences than
  ranks does a rank run empty passes: no response tokens, zero loss, zero gradient) and every
  method is called on every rank in the same order (Ray runs one caller's calls to an actor in
  order).
- **Weights leave whole.** ``full_weights`` gathers the full HF state dict (every rank takes
  part); rank 0 holds it, so rank 0's ``publish`` ticket is the one the instances receive.
- **Checkpoints are the single trainer's format.** Rank 0 writes HF safetensors, the tokenizer
  and ``optimizer.pt`` as the full (unsharded) AdamW state keyed like a single trainer's, so a
  checkpoint loads with any ``train.devices``.

pi_prox and the KL reference are sharded copies (built from the model's config, loaded from
the sharded state dict; no gather). Left out: tensor/sequence parallelism, CPU offload of
parameters.

Precision: the sharded master weights and AdamW state are float32; a 16-bit ``model.dtype``
is FSDP2's ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32)`` (parameters
all-gathered in 16 bits for forward/backward, gradients reduced in float32), the single
trainer's rule in FSDP's own terms.
"""
from __future__ import annotations

import functools

from .fsdp_rank import DUMMY_TOKENS, FSDPTrainerRank  # noqa: F401 - importable from here too
from ..scheduler.microbatch import plan_micro_batches, step_denominator


def split_micro_batches(samples: list[dict], world: int, mode: str, max_tokens: int,
                        micro: int) -> list[tuple[list[dict], list[list[int]]]]:
    """Per rank: (its samples, its micro-batches as indices into them), planned for all ranks
    at once (:func:`~asp_ascend.scheduler.microbatch.plan_micro_batches` with ``world`` ranks)."""
    plan = plan_micro_batches(samples, mode, max_tokens, micro, world)
    out = []
    for rank in plan.ranks:
        mine = [i for mb in rank for i in mb]
        at = {i: k for k, i in enumerate(mine)}
        out.append(([samples[i] for i in mine], [[at[i] for i in mb] for mb in rank]))
    return out


def merge_steps(steps: list[dict]) -> dict:
    """One step record from the ranks' records (token sums added; ratios recomputed)."""
    s = {k: sum(st["sums"][k] for st in steps) for k in steps[0]["sums"]}
    s["diff_max"] = max(st["sums"]["diff_max"] for st in steps)
    ntok = max(s["tokens"], 1.0)
    n = int(s["diff_n"])
    return {"t_start": min(st["t_start"] for st in steps), "t_end": max(st["t_end"] for st in steps),
            "t_first": min(st.get("t_first", st["t_start"]) for st in steps), "parts": steps[0].get("parts", 1),
            "tokens": sum(st["tokens"] for st in steps), "padded_tokens": sum(st["padded_tokens"] for st in steps),
            "loss": s["loss"], "clip_frac": s["clipped"] / ntok, "is_weight_mean": s["weight"] / ntok,
            "kl": s["kl"] / ntok, "grad_norm": steps[0]["grad_norm"],
            "logprob_diff_max": s["diff_max"] if n else None, "logprob_diff_mean": s["diff_sum"] / n if n else None,
            "sums": s, "ranks": len(steps)}


class _Method:
    """``group.<name>.remote(...)``: one ObjectRef, like a method of one actor."""

    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


class _remote:
    """Declares a TrainerGroup method with an actor method's call surface: ``group.m.remote(...)``
    calls the decorated function and returns its one ObjectRef."""

    def __init__(self, fn):
        self._fn = fn

    def __get__(self, group, owner=None):
        return self if group is None else _Method(functools.partial(self._fn, group))


def _on_all_ranks(name: str) -> _remote:
    """A method every rank runs; its ref resolves (to rank 0's answer) once all have answered."""
    return _remote(lambda group, *args, **kwargs: group._all(name, *args, **kwargs))


def _on_rank0(name: str) -> _remote:
    return _remote(lambda group, *args, **kwargs: getattr(group.ranks[0], name).remote(*args, **kwargs))


class TrainerGroup:
    """``world`` :class:`FSDPTrainerRank` actors behind the single trainer actor's call surface
    (the ``Trainer`` contract, pipeline/contracts.py).

    ``actor_options``: Ray options of each rank (``num_cpus``, the platform's device resource,
    ``runtime_env``); ``rank_kwargs``: each rank's TrainerEngine arguments (``cpu_cores`` may
    differ per rank: pass ``cores_per_rank``). Blocks until every rank has loaded its shard.
    """
    ready = _on_all_ranks("ready")
    begin_iteration = _on_all_ranks("begin_iteration")
    sft = _on_all_ranks("sft")
    sequence_logprobs = _on_all_ranks("sequence_logprobs")
    save_checkpoint = _on_all_ranks("save_checkpoint")
    load_checkpoint = _on_all_ranks("load_checkpoint")
    shutdown = _on_all_ranks("shutdown")
    node_ip = _on_rank0("node_ip")
    open_group = _on_rank0("open_group")
    send_weights = _on_rank0("send_weights")

    def __init__(self, model_dir: str, world: int, *, actor_options: dict | None = None,
                 cores_per_rank: list[list[int]] | None = None, **rank_kwargs):
        import ray

        self.world = int(world)
        actor = ray.remote(FSDPTrainerRank)
        opts = dict(actor_options or {})
        self.ranks = [actor.options(**opts).remote(str(model_dir), rank=r, world_size=self.world,
                                                   **{**rank_kwargs, "cpu_cores": (cores_per_rank or [[]] * world)[r]})
                      for r in range(self.world)]
        addr, port = ray.get(self.ranks[0].endpoint.remote())
        ray.get([a.connect.remote(addr, port) for a in self.ranks])
        self._mb_settings = ray.get(self.ranks[0].micro_batch_settings.remote())  # mode as resolved by the ranks
        loss = rank_kwargs.get("loss")
        self._loss_agg = getattr(loss, "loss_agg", "token-mean-step")
        self._pick = ray.remote(num_cpus=0)(_pick)
        self._merge = ray.remote(num_cpus=0)(_merge)
        self._merge_parts = ray.remote(num_cpus=0)(_merge_parts)

    def _all(self, name: str, *args, **kwargs):
        refs = [getattr(a, name).remote(*args, **kwargs) for a in self.ranks]
        return self._pick.remote(0, *refs)  # waits for every rank; rank 0's answer

    @_remote
    def train_step(self, samples: list[dict], denom: float | None = None):
        """``denom``: what the step divides by (default: the whole mini-batch's, see
        scheduler/microbatch.step_denominator); every rank divides by the same number."""
        shares = split_micro_batches(samples, self.world, *self._mb_settings)
        if denom is None:
            denom = step_denominator(samples, self._loss_agg)
        passes = max(1, max(len(mbs) for _, mbs in shares))
        refs = [a.train_step.remote(sh, denom, mbs, passes) for a, (sh, mbs) in zip(self.ranks, shares)]
        return self._merge.remote(*refs)

    @_remote
    def accumulate(self, samples: list[dict]):
        """Part of a streamed step (``pipeline.stream_groups``): ``samples`` split over the ranks
        as :meth:`train_step` splits a mini-batch; gradients summed, not yet scaled."""
        shares = split_micro_batches(samples, self.world, *self._mb_settings)
        passes = max(1, max(len(mbs) for _, mbs in shares))
        return self._merge_parts.remote(*[a.accumulate.remote(sh, mbs, passes)
                                          for a, (sh, mbs) in zip(self.ranks, shares)])

    @_remote
    def apply_step(self, denom: float):
        """End the streamed step: every rank divides its summed gradients by ``denom``, then steps."""
        return self._merge.remote(*[a.apply_step.remote(denom) for a in self.ranks])

    @_remote
    def publish(self, version: int, transport: str = "object_store"):
        """Every rank takes part in the gather; rank 0's ticket carries the weights."""
        refs = [a.publish.remote(version, transport) for a in self.ranks]
        self._last_publish = refs  # the other ranks' (empty) tickets stay alive until the next publish
        return refs[0]

    def kill(self) -> None:
        import ray

        for a in self.ranks:
            ray.kill(a)


def _pick(i: int, *values):
    return values[i]


def _merge(*steps):
    return merge_steps(list(steps))


def _merge_parts(*parts):
    """One part record (``accumulate``) from the ranks'."""
    return {"t_start": min(p["t_start"] for p in parts), "t_end": max(p["t_end"] for p in parts),
            "tokens": sum(p["tokens"] for p in parts), "samples": sum(p["samples"] for p in parts)}
