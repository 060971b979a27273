"""The trainer: a transformers causal LM, AdamW, GRPO optimizer steps, weight publishing.

:class:`TrainerEngine` is a plain class (in-process implementation); :func:`trainer_actor_class`
wraps it as a Ray actor. One ``train_step`` call = one optimizer step over one mini-batch, split
into micro-batches (gradient accumulation, token-mean loss over the mini-batch). Streamed
(``pipeline.stream_groups``): ``accumulate`` calls, one per batch of generated groups, then
``apply_step(denom)``, which scales the summed gradients by the mini-batch's denominator and
steps: the same update as ``train_step`` on the whole mini-batch, up to float rounding.

Micro-batches (``train.micro_batching``, cut by scheduler/microbatch.py under the token budget
``train.max_tokens_per_micro_batch``): ``padded`` (arrival order, padded rows), ``sorted`` (by
length, padded rows) or ``packed`` (one row per micro-batch, no pad token; engines/packing.py).
``auto`` packs when the platform's attention keeps packed sequences apart on the loaded model
(checked at start-up), else sorts. Every micro-batch's loss sum is divided by the same ``denom``,
so the step's gradient is the same whichever way its sequences are grouped.

Off-policy correction needs pi_prox, the trainer's weights at the start of the iteration:
for the iteration's first optimizer step these are the current weights (no extra pass);
later steps use a frozen copy taken at ``begin_iteration`` (only when an iteration has
several mini-batches). A reference copy for the KL term is kept only when ``kl_coef > 0``.

Precision: the weights the optimizer updates (master weights) and AdamW's state are always
float32. ``dtype`` (``model.dtype``) is the compute precision: with a 16-bit dtype forward
and backward run under autocast in that dtype (a sharded trainer: FSDP2's
``MixedPrecisionPolicy``), and the weights published to the rollout instances are cast to it.
Updating 16-bit weights directly would round most small AdamW updates away (at lr 1e-6 about
2 % of bf16 weights change over ten steps).
"""
from __future__ import annotations

import time
from pathlib import Path

from ..algos.grpo import LossConfig, policy_loss, token_logprobs
from ..io import output_to_actor_log
from ..platforms.attention import packed_attention
from ..platforms.communicators import SenderEndpoint
from ..scheduler.microbatch import MODES, plan_micro_batches, step_denominator
from . import checkpoint_io
from .layout import ModelLayout, Replicated
from .packing import build_micro_batch, micro_batch_logprobs, packing_supported


class TrainerEngine:
    def __init__(self, model_dir: str, *, lr: float, weight_decay: float, loss: LossConfig,
                 micro_batch_size: int, temperature: float, seed: int, dtype: str = "float32",
                 cpu_cores: list[int] | None = None, platform: str = "cpu", bucket_bytes: int = 1 << 30,
                 top_p: float = 1.0, micro_batching: str = "auto", max_tokens_per_micro_batch: int = 0,
                 layout: ModelLayout | None = None):
        from ..engines.rollout import pin_process

        output_to_actor_log()  # logging.actor_output: log -> this process's output goes to train.log
        pin_process(list(cpu_cores or []))
        import torch
        from transformers import AutoModelForCausalLM

        from .tiny_model import load_tokenizer

        from ..platforms import get_platform

        self.platform = get_platform(platform)
        self.layout = layout or Replicated()
        self.bucket_bytes = int(bucket_bytes)
        if cpu_cores:
            torch.set_num_threads(len(cpu_cores))
        self.platform.manual_seed(seed)
        self.device = self.platform.torch_device(0)
        self._sender = SenderEndpoint(self.device.index or 0)   # rank 0 of the broadcast weight sync
        self.compute_dtype = getattr(torch, dtype)
        if self.compute_dtype == torch.float16:
            raise ValueError("model.dtype: 'float16' is not supported for training (float16 gradients need a loss "
                             "scaler and this trainer has none); use model.dtype=bfloat16 or float32")
        if self.compute_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"model.dtype: {dtype!r} is not one of float32, bfloat16")
        if micro_batching not in ("auto", *MODES):
            raise ValueError(f"train.micro_batching: {micro_batching!r} is not one of auto, {', '.join(MODES)}")
        attn, self.varlen = (packed_attention(self.platform.name) if micro_batching in ("auto", "packed")
                             else (None, False))
        # float32 master weights (and so float32 AdamW state) whatever the compute dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     **({"attn_implementation": attn} if attn else {}))
        self.micro_batching = self._resolve_micro_batching(micro_batching, model.to(self.device), attn)
        self.max_tokens = int(max_tokens_per_micro_batch)
        self.model = self.layout.wrap(model, self.compute_dtype)
        self.tokenizer = load_tokenizer(model_dir)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.loss_cfg = loss
        self.micro = micro_batch_size
        self.temperature = temperature
        self.top_p = float(top_p)  # the rollout's nucleus: log-probs are those of the sampling distribution
        self.pad_id = self.tokenizer.pad_token_id
        self.version = 0
        self.prox_model = None
        self.ref_model = None
        self._steps_in_iteration = 0
        self._acc = None   # an open accumulation (accumulate .. apply_step)

    def _resolve_micro_batching(self, mode: str, model, attn: str | None) -> str:
        """``auto``/``packed``: pack when a probe on ``model`` shows its attention (``attn``) keeps
        packed sequences apart; else ``auto`` sorts and ``packed`` is an error."""
        if mode not in ("auto", "packed"):
            return mode
        ok, diff = packing_supported(model, device=self.device, varlen=self.varlen)
        if ok:
            return "packed"
        if mode == "packed":
            raise ValueError(f"train.micro_batching: packed, but attention {attn!r} on platform "
                             f"{self.platform.name!r} mixes packed sequences (log-prob difference {diff:.3g}); "
                             "use train.micro_batching=sorted (or auto)")
        self.varlen = False
        return "sorted"

    def _autocast(self):
        """Forward/backward in the compute dtype (the master weights stay float32; a layout that
        casts the parameters itself, FSDP2's mixed precision, needs no autocast)."""
        import contextlib

        import torch

        if self.compute_dtype == torch.float32 or self.layout.casts_itself:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def logprobs(self, model, ids, att, temperature: float = 1.0, top_p: float = 1.0):
        """Per-token log-probs of padded ``ids`` under ``model`` in the compute dtype."""
        with self._autocast():
            return token_logprobs(model, ids, att, temperature, top_p)

    # ------------------------------------------------------------------ batches
    def micro_batch_settings(self) -> tuple[str, int, int]:
        """(micro_batching as resolved at start-up, max_tokens_per_micro_batch, micro_batch_size)."""
        return self.micro_batching, self.max_tokens, self.micro

    def micro_batches(self, samples: list[dict], plan: list[list[int]] | None = None) -> list[list[dict]]:
        """``samples`` grouped by ``plan`` (indices into them; default: this trainer's own plan)."""
        if plan is None:
            plan = plan_micro_batches(samples, *self.micro_batch_settings()).ranks[0]
        return [[samples[i] for i in mb] for mb in plan]

    def pad(self, seqs: list[list[int]]):
        """(input ids, attention mask) of ``seqs`` right-padded to one length, on the device."""
        import torch

        T = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(seqs), T), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            att[i, :len(s)] = 1
        return ids.to(self.device), att.to(self.device)

    def response_tensor(self, rows: list[list[float]], prompt_lens: list[int], T: int, fill: float = 0.0):
        """Per-token values of the responses, aligned with next-token targets [B, T-1]."""
        import torch

        out = torch.full((len(rows), T - 1), fill, dtype=torch.float32)
        for i, (vals, p) in enumerate(zip(rows, prompt_lens)):
            if vals:
                out[i, p - 1:p - 1 + len(vals)] = torch.tensor(vals, dtype=torch.float32)
        return out.to(self.device)

    # ------------------------------------------------------------------ warm start
    def sft(self, examples: list[tuple[list[int], list[int]]], steps: int, batch_size: int, lr: float,
            seed: int) -> list[float]:
        """Supervised warm start on (prompt ids, answer ids + eos): cross-entropy on the answer."""
        import numpy as np
        import torch

        rng = np.random.default_rng(seed)
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            pick = rng.choice(len(examples), size=min(batch_size, len(examples)), replace=False)
            batch = [examples[i] for i in pick]
            ids, att = self.pad([p + a for p, a in batch])
            mask = self.response_tensor([[1.0] * len(a) for _, a in batch], [len(p) for p, _ in batch], ids.shape[1])
            logp = self.logprobs(self.model, ids, att)
            loss = -(logp * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    # ------------------------------------------------------------------ RL
    def begin_iteration(self, version: int, mini_batches: int) -> None:
        """Called before the first optimizer step of iteration ``version``."""
        if self._acc is not None:
            raise RuntimeError(f"begin_iteration({version}): a streamed step (accumulate) of the previous "
                               "iteration is still open")
        self.version = version
        self._steps_in_iteration = 0
        if self.loss_cfg.kl_coef > 0 and self.ref_model is None:
            self.ref_model = self.layout.frozen_copy(self.model, self.device)
        if self.loss_cfg.off_policy != "none" and mini_batches > 1:
            if self.prox_model is None:
                self.prox_model = self.layout.frozen_copy(self.model, self.device)
            else:
                self.prox_model.load_state_dict(self.model.state_dict())

    def train_step(self, samples: list[dict], denom: float | None = None,
                   micro_batches: list[list[int]] | None = None) -> dict:
        """One optimizer step over ``samples`` (prompt_ids, response_ids, behav_logprobs, advantage).

        The loss is divided by ``denom`` (default: :func:`step_denominator` of ``samples``; the
        orchestrator passes the iteration's for ``token-mean-iteration``, a data-parallel rank
        the whole mini-batch's). A sample with ``"masked": True`` takes part in nothing but the
        token counts (``train.truncated=mask``). ``micro_batches``: indices into ``samples``, one
        list per micro-batch (default: this trainer's own plan). Returns timings, token counts
        (real and pad slots), loss statistics and their raw token sums (``sums``).
        """
        if self._acc is not None:
            raise RuntimeError("train_step: an accumulation (accumulate) is open; finish it with apply_step first")
        if denom is None:
            denom = step_denominator(samples, self.loss_cfg.loss_agg)
        acc = self._new_acc()
        self.opt.zero_grad(set_to_none=True)
        self._backward(samples, max(float(denom), 1.0), micro_batches, acc)
        return self._step(acc)

    def accumulate(self, samples: list[dict], micro_batches: list[list[int]] | None = None) -> dict:
        """Forward/backward of part of an optimizer step (``pipeline.stream_groups``: the groups of
        a mini-batch generated so far), gradients summed over the calls and NOT scaled: the
        denominator (the whole mini-batch's, known once its last group is generated) is applied
        by :meth:`apply_step`, which ends the step. The weights do not change, so pi_prox of the
        iteration's first step is still the current weights. Returns this part's timing and tokens."""
        t0 = time.time()
        if self._acc is None:
            self._acc = self._new_acc(t0)
            self.opt.zero_grad(set_to_none=True)
        before = self._acc["tokens"]
        try:
            self._backward(samples, 1.0, micro_batches, self._acc)
        except BaseException:  # half a part's gradients must never reach a step: drop the whole step
            self._acc = None
            self.opt.zero_grad(set_to_none=True)
            raise
        t1 = time.time()
        self._acc["busy"] += t1 - t0
        self._acc["parts"] += 1
        return {"t_start": t0, "t_end": t1, "tokens": self._acc["tokens"] - before, "samples": len(samples)}

    def apply_step(self, denom: float) -> dict:
        """End the step :meth:`accumulate` opened: gradients / ``denom`` (what :meth:`train_step`
        divides each micro-batch's loss by: the same update up to float rounding), clip, AdamW.
        The record is :meth:`train_step`'s over all parts, its ``t_start`` = ``t_end`` minus the
        seconds the trainer was busy on the step (so a trainer's busy time adds up from the
        records, as the simulator writes streamed steps); ``t_first``: when its first part began."""
        acc = self._acc
        if acc is None:
            raise RuntimeError("apply_step: no accumulation is open (accumulate was not called)")
        self._acc = None
        d = max(float(denom), 1.0)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(d)
        acc["tot"]["loss"] /= d
        return self._step(acc)

    def _new_acc(self, t_first: float | None = None) -> dict:
        return {"t_first": time.time() if t_first is None else t_first, "busy": 0.0, "parts": 0, "tokens": 0, "padded": 0,
                "tot": {"loss": 0.0, "clipped": 0.0, "tokens": 0.0, "weight": 0.0, "kl": 0.0},
                "diff": [0.0, 0.0, 0]}   # max, sum, count

    def _backward(self, samples: list[dict], denom: float, micro_batches: list[list[int]] | None, acc: dict) -> None:
        """Forward/backward of ``samples``' micro-batches, each loss sum / ``denom``, into ``acc``."""
        import torch

        seq_mean = self.loss_cfg.loss_agg == "seq-mean"
        first = self._steps_in_iteration == 0
        tot, diff = acc["tot"], acc["diff"]
        for mb in self.micro_batches(samples, micro_batches):
            batch = build_micro_batch([s["prompt_ids"] + s["response_ids"] for s in mb],
                                      packed=self.micro_batching == "packed", pad_id=self.pad_id,
                                      device=self.device, varlen=self.varlen)
            offs = [len(s["prompt_ids"]) for s in mb]
            counts = [len(s["response_ids"]) for s in mb]
            acc["tokens"] += batch.tokens
            acc["padded"] += batch.slots - batch.tokens
            mask = batch.per_token([[0.0 if s.get("masked") else 1.0] * c for s, c in zip(mb, counts)], offs)
            tw = None
            if seq_mean:  # every sample weighs the same: its tokens share 1
                tw = batch.per_sequence([1.0 / max(c, 1) for c in counts], offs, counts)
            behav = batch.per_token([s["behav_logprobs"] for s in mb], offs)
            adv = batch.per_sequence([float(s["advantage"]) for s in mb], offs, counts)
            with self._autocast():
                logp = micro_batch_logprobs(self.model, batch, self.temperature, self.top_p)
            prox = ref = None
            if self.loss_cfg.off_policy != "none":
                if first or self.prox_model is None:
                    prox = logp.detach()
                else:
                    with torch.no_grad():
                        with self._autocast():
                            prox = micro_batch_logprobs(self.prox_model, batch, self.temperature, self.top_p)
            if self.ref_model is not None:
                with torch.no_grad(), self._autocast():
                    ref = micro_batch_logprobs(self.ref_model, batch, self.temperature, self.top_p)
            loss, st = policy_loss(logp, behav, adv, mask, self.loss_cfg, prox, ref, token_weight=tw)
            (loss / denom).backward()
            tot["loss"] += loss.item() / denom
            for key in ("clipped", "tokens", "weight", "kl"):
                tot[key] += st.get(key, 0.0)
            if first:  # behaviour vs trainer log-probs for samples drawn by exactly this version
                fresh = [float(s.get("version_first") == self.version == s.get("version_last")) for s in mb]
                m = mask * batch.per_sequence(fresh, offs, counts)
                if m.sum() > 0:
                    d = (logp.detach() - behav).abs() * m
                    diff[0] = max(diff[0], float(d.max()))
                    diff[1] += float(d.sum())
                    diff[2] += int(m.sum())

    def _step(self, acc: dict) -> dict:
        """Clip at the global norm, AdamW (skipped on a NaN/inf norm), the step's record."""
        import torch

        t_step = time.time()
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if torch.isfinite(gn):  # (the norm is global: every data-parallel rank decides alike)
            self.opt.step()
        else:  # a NaN/inf gradient would poison the weights: skip the step, the driver stops the run
            self.opt.zero_grad(set_to_none=True)
        self._steps_in_iteration += 1
        t_end = time.time()
        tot = acc["tot"]
        diff_max, diff_sum, diff_n = acc["diff"]
        ntok = max(tot["tokens"], 1.0)
        busy = acc["busy"] + (t_end - t_step) if acc["parts"] else t_end - acc["t_first"]
        return {"t_start": t_end - busy, "t_end": t_end, "t_first": acc["t_first"], "parts": max(acc["parts"], 1),
                "tokens": acc["tokens"], "padded_tokens": acc["padded"],
                "loss": tot["loss"], "clip_frac": tot["clipped"] / ntok, "is_weight_mean": tot["weight"] / ntok,
                "kl": tot["kl"] / ntok, "grad_norm": float(gn),
                "logprob_diff_max": diff_max if diff_n else None,
                "logprob_diff_mean": diff_sum / diff_n if diff_n else None,
                "sums": {**tot, "diff_sum": diff_sum, "diff_n": diff_n, "diff_max": diff_max}}

    # ------------------------------------------------------------------ weights
    def full_weights(self) -> list:
        """The full (unsharded) weights as (name, tensor) in HF names (a sharded layout gathers
        them: a collective every rank calls; the ranks other than 0 get [])."""
        return self.layout.full_weights(self.model)

    def publish(self, version: int, transport: str = "object_store"):
        """A ``WeightTicket`` for ``version``.

        ``object_store``: the ticket carries one ``ray.put`` of the weights. ``broadcast``: the
        ticket carries only the bucket layout; the weights wait here until ``send_weights``
        broadcasts them to the instances that were handed the ticket.
        """
        import torch

        from ..platforms.transport import RayObjectStoreTransport, WeightTicket, plan_buckets, specs_of

        self.version = version
        named = self.full_weights()
        if self.compute_dtype != torch.float32:  # the instances run (and receive) the compute dtype
            named = [(n, t.to(self.compute_dtype) if t.is_floating_point() else t) for n, t in named]
        if transport == "object_store":  # (a pending broadcast of this version stays available)
            return RayObjectStoreTransport().prepare(version, named)
        if transport != "broadcast":
            raise ValueError(f"weight_sync.transport: unknown {transport!r}")
        self._pending = (version, named)
        return WeightTicket(version, plan_buckets(specs_of(named), self.bucket_bytes))

    def node_ip(self) -> str:
        """Where the weight-sync group's store listens (this actor's node)."""
        import ray

        return ray.util.get_node_ip_address()

    def open_group(self, gen: int, world: int, port: int = 0, timeout_s: float = 300.0) -> int:
        """Start weight-sync group ``gen``'s rendezvous (this trainer is its rank 0) and return the
        port its store listens on; the instances are told that port afterwards, so nothing can take
        it in between. ``port`` 0: the OS picks one; else that port (a ``ConfigError`` naming
        ``weight_sync.master_port`` if it is taken). The previous group is dropped first."""
        return self._sender.listen({"gen": int(gen), "host": self.node_ip(), "port": int(port), "world": int(world),
                                    "timeout_s": float(timeout_s)})

    def send_weights(self, version: int, group: dict) -> dict:
        """Broadcast the weights ``publish(version, "broadcast")`` kept to the instances of
        ``group`` (``{"gen", "host", "port", "world"}``; this trainer is rank 0). A new ``gen``
        (the set of instances changed) builds a new communicator on the store ``open_group(gen)``
        started (without one: on ``port``, bound now)."""
        from ..platforms.recv_wait import STALL_S
        from ..platforms.transport import BroadcastTransport

        if getattr(self, "_pending", None) is None or self._pending[0] != version:
            self._sender.fail(version)   # the instances joining or waiting on this group learn at once that nothing comes
            raise RuntimeError(f"send_weights({version}): publish({version}, 'broadcast') did not run first")
        t0 = time.time()
        _, named = self._pending

        def broadcast(comm):   # a receiver with no progress for the stall timeout ends the send (recv_wait)
            tx = BroadcastTransport(comm, self.bucket_bytes, synchronize=self.platform.synchronize,
                                    stall_s=float(group.get("stall_timeout_s", STALL_S)))
            tx.send(tx.prepare(version, named), named)

        self._sender.send({**group, "platform": self.platform.name}, broadcast, version)   # a failure drops the group
        return {"t_start": t0, "t_end": time.time(), "version": version}

    def sequence_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        import torch

        ids, att = self.pad([list(prompt_ids) + list(response_ids)])
        with torch.no_grad():
            lp = self.logprobs(self.model, ids, att, 1.0)[0]
        return [float(x) for x in lp[len(prompt_ids) - 1:]]

    def save_checkpoint(self, path: str, state: dict) -> str:
        """Model + tokenizer + optimizer + RNG + ``state`` (+ the KL reference) into ``path``
        (engines/checkpoint_io.py: written aside, then renamed)."""
        if self._acc is not None:
            raise RuntimeError("save_checkpoint: a streamed step (accumulate) is open; its gradients would be lost")
        return checkpoint_io.write_checkpoint(path, self.model, self.tokenizer, self.opt.state_dict(),
                                              {"version": self.version, **state},
                                              reference=self.reference_state())

    def reference_state(self) -> dict | None:
        """The KL reference's full weights (None without one). A sharded trainer gathers them."""
        if self.ref_model is None:
            return None
        return {k: v.detach().to("cpu").clone() for k, v in self.ref_model.state_dict().items()}

    def load_reference(self, path: Path) -> None:
        """The KL reference of the checkpoint at ``path`` (``kl_coef > 0``): the policy after the
        warm start, not the resumed weights (docs/runtime.md)."""
        from safetensors.torch import load_file

        if self.loss_cfg.kl_coef <= 0:
            return
        f = checkpoint_io.reference_file(path, self.loss_cfg.kl_coef)
        self.ref_model = self.layout.frozen_copy(self.model, self.device)
        self.ref_model.load_state_dict(load_file(str(f), device=str(self.device)))

    def load_checkpoint(self, path: str) -> int:
        """Restore optimizer, policy version, RNG states and the KL reference from ``path`` (a
        folder written by ``save_checkpoint``; the weights were loaded from it at construction).
        Returns the version."""
        self.opt.load_state_dict(checkpoint_io.read_optimizer(path, self.device))
        checkpoint_io.restore_rng(path)
        self.load_reference(Path(path))
        self.version = checkpoint_io.read_version(path)
        return self.version

    def ready(self) -> int:
        return self.version


def trainer_actor_class():
    import ray

    return ray.remote(TrainerEngine)
