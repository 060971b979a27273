"""GRPO advantages and the clipped policy loss with off-policy corrections (torch).

Per token t of a sample with advantage A (its group-normalised reward):

- ``none``:           r = pi_theta / pi_behav;  loss = -min(r A, clip(r, 1-eps, 1+eps) A)
- ``decoupled_ppo``:  r = pi_theta / pi_prox;   w = pi_prox / pi_behav;
                      loss = -w min(r A, clip(r) A), tokens with w > cap masked out
                      (decoupled PPO, Hilton et al. 2022 / AReaL: clip around the proximal
                      policy = the trainer's weights at the start of the iteration)
- ``tis``:            as decoupled_ppo, but w = min(pi_prox / pi_behav, cap) (truncated IS)

pi_behav is the behaviour log-prob recorded by the rollout engine for each token (the
weights that drew it, possibly several versions for one sample); pi_prox is recomputed
by the trainer. KL to a reference (k3 estimator) is added when ``kl_coef > 0``.
The loss is a token mean over the whole mini-batch (every token weighs the same).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OFF_POLICY_MODES = ("decoupled_ppo", "tis", "none")


def group_advantages(rewards, eps: float = 1e-6) -> np.ndarray:
    """(r - mean) / (std + eps) within one group of G samples; zeros when all are equal."""
    r = np.asarray(rewards, dtype=np.float64)
    std = r.std()
    if r.size < 2 or std < eps:
        return np.zeros_like(r)
    return (r - r.mean()) / (std + eps)


@dataclass
class LossConfig:
    clip_eps: float = 0.2
    off_policy: str = "decoupled_ppo"
    cap: float = 2.0
    kl_coef: float = 0.0

    def __post_init__(self):
        if self.off_policy not in OFF_POLICY_MODES:
            raise ValueError(f"off_policy: {self.off_policy!r} is not one of {', '.join(OFF_POLICY_MODES)}")


def policy_loss(logp, behav_logp, adv, mask, cfg: LossConfig, prox_logp=None, ref_logp=None):
    """Sum of per-token losses over ``mask`` (all tensors [B, T]) and statistics.

    Returns (loss_sum, stats) where stats are token sums: clipped, masked, kl, weight.
    """
    import torch

    mask = mask.to(logp.dtype)
    if cfg.off_policy == "none" or prox_logp is None:
        base = behav_logp
        weight = torch.ones_like(logp)
    else:
        base = prox_logp
        w = torch.exp(prox_logp - behav_logp)
        if cfg.off_policy == "tis":
            weight = torch.clamp(w, max=cfg.cap)
        else:
            keep = (w <= cfg.cap).to(logp.dtype)
            mask = mask * keep
            weight = w
    ratio = torch.exp(logp - base)
    a = adv[:, None] if adv.dim() == 1 else adv
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * a
    pg = -torch.minimum(unclipped, clipped) * weight.detach()
    loss = (pg * mask).sum()
    stats = {"clipped": float(((unclipped != clipped).to(logp.dtype) * mask).sum()),
             "tokens": float(mask.sum()),
             "weight": float((weight.detach() * mask).sum())}
    if cfg.kl_coef > 0 and ref_logp is not None:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1.0
        loss = loss + cfg.kl_coef * (kl * mask).sum()
        stats["kl"] = float((kl.detach() * mask).sum())
    return loss, stats


def token_logprobs(model, input_ids, attention_mask, temperature: float = 1.0, top_p: float = 1.0,
                   **forward_kwargs):
    """Log-prob of each next token: [B, T-1] for targets input_ids[:, 1:].

    ``forward_kwargs`` go to the model's forward (a packed row passes ``position_ids`` and no
    attention mask; see engines/packing.py).

    The distribution the rollout engine sampled from: logits / temperature, then with
    ``top_p < 1`` restricted to the nucleus and renormalised (the rule vLLM applies before it
    reports ``processed_logprobs``: sort ascending, drop tokens whose cumulative probability
    is <= 1 - top_p, always keep the most likely). The target token is always kept, so a
    float difference at the nucleus edge cannot turn its log-prob into -inf.
    """
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    target = input_ids[:, 1:, None]
    if top_p < 1.0:
        logits = logits.masked_fill(nucleus_drop_mask(logits, top_p, target), float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, target).squeeze(-1)


def nucleus_drop_mask(logits, top_p: float, keep=None):
    """Boolean mask of the tokens outside the top-p nucleus (same shape as ``logits``);
    ``keep`` (indices along the last axis) are never dropped."""
    import torch

    with torch.no_grad():
        srt, idx = logits.sort(dim=-1, descending=False)
        cum = srt.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        if keep is not None:
            drop.scatter_(-1, keep, False)
    return drop
