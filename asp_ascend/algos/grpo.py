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
by the trainer. KL to a reference (k3 estimator, log-ratio clamped to [-20, 20] and the
estimate to [-10, 10] as verl's ``low_var_kl``) is added when ``kl_coef > 0``.

``policy_loss`` returns a sum over tokens; how sums become a step's loss is ``train.loss_agg``
(:data:`LOSS_AGG`, engines/trainer.py): ``token-mean-iteration`` (default) divides every
optimizer step of an iteration by the same number, so every token of the iteration weighs
the same whatever mini-batch it lands in (ASP orders mini-batches by length: dividing each
step by its own tokens would make a token of a short mini-batch weigh more, the length bias
Dr. GRPO and DAPO removed); ``token-mean-step`` divides by the step's own tokens;
``seq-mean`` averages tokens within each sample, then samples within the step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OFF_POLICY_MODES = ("decoupled_ppo", "tis", "none")
LOSS_AGG = ("token-mean-iteration", "token-mean-step", "seq-mean")


def group_advantages(rewards, eps: float = 1e-6, unbiased: bool = True) -> np.ndarray:
    """(r - mean) / (std + eps) within one group of G samples; zeros when all are equal.

    ``unbiased``: the sample std (divides by G - 1), as verl's GRPO (``torch.std``); False
    divides by G."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2:
        return np.zeros_like(r)
    std = r.std(ddof=1 if unbiased else 0)
    if std < eps:
        return np.zeros_like(r)
    return (r - r.mean()) / (std + eps)


def iteration_denominator(predicted_sum: float, prompts: int, group_size: int, mini_batches: int,
                          max_tokens: int) -> float:
    """``token-mean-iteration``: what each of an iteration's optimizer steps divides its loss sum
    by, the iteration's response tokens / its mini-batches, known before its first step: every
    sample at its prompt's predicted length (``predicted_sum`` / ``prompts``, clamped to
    [1, ``max_tokens``]; ``max_tokens`` without a prediction)."""
    per_sample = predicted_sum / prompts if prompts and predicted_sum > 0 else float(max_tokens)
    per_sample = min(max(per_sample, 1.0), float(max_tokens))
    return per_sample * max(prompts, 1) * group_size / max(mini_batches, 1)


@dataclass
class LossConfig:
    clip_eps: float = 0.2
    off_policy: str = "decoupled_ppo"
    cap: float = 2.0
    kl_coef: float = 0.0
    loss_agg: str = "token-mean-iteration"

    def __post_init__(self):
        if self.off_policy not in OFF_POLICY_MODES:
            raise ValueError(f"off_policy: {self.off_policy!r} is not one of {', '.join(OFF_POLICY_MODES)}")
        if self.loss_agg not in LOSS_AGG:
            raise ValueError(f"train.loss_agg: {self.loss_agg!r} is not one of {', '.join(LOSS_AGG)}")


def k3_kl(ref_logp, logp):
    """k3 estimate of KL(pi_theta || pi_ref) per token, clamped as verl's ``low_var_kl``: the
    log-ratio to [-20, 20], the estimate to [-10, 10] (a token the reference finds nearly
    impossible would otherwise give exp(d) = inf and a NaN gradient)."""
    import torch

    d = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


def policy_loss(logp, behav_logp, adv, mask, cfg: LossConfig, prox_logp=None, ref_logp=None, token_weight=None):
    """Sum of per-token losses over ``mask`` (all tensors [B, T]) and statistics.

    ``token_weight`` ([B, T] or [B, 1], optional) multiplies each token's loss (``seq-mean``:
    1 / the sample's tokens). Returns (loss_sum, stats) where stats are token sums: clipped
    (tokens where the clip is active: the clipped term is the one the min takes, as verl's
    ``pg_clipfrac``), tokens, kl, weight.
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
    lmask = mask if token_weight is None else mask * token_weight
    loss = (pg * lmask).sum()
    stats = {"clipped": float(((clipped < unclipped).to(logp.dtype) * mask).sum()),
             "tokens": float(mask.sum()),
             "weight": float((weight.detach() * mask).sum())}
    if cfg.kl_coef > 0 and ref_logp is not None:
        kl = k3_kl(ref_logp, logp)
        loss = loss + cfg.kl_coef * (kl * lmask).sum()
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
