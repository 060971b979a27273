"""Training-correctness guards that run without vLLM (docs/runtime.md, "Correctness").

Each test fails without its guard: config checks that name the key, GRPO's unbiased std,
verl's clip fraction and clamped k3 KL, rewards that never give a truncated answer full
credit, and a loss aggregation whose total gradient does not depend on how an iteration is
split into mini-batches.
"""
import random

import numpy as np
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError


# ----------------------------------------------------------------- config checks (item 6)

@pytest.mark.parametrize("override,key", [
    ("rollout.temperature=0", "rollout.temperature"),
    ("rollout.temperature=-1.0", "rollout.temperature"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("train.group_size=1", "train.group_size"),
])
def test_sampling_and_group_checks_name_the_key_and_the_fix(empty_yaml, override, key):
    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, [override])
    (problem,) = [p for p in ei.value.problems if p.startswith(key)]
    assert "use e.g." in problem  # the fix


def test_float16_rejected_for_training(empty_yaml, tiny):
    """float16 without a loss scaler under/overflows gradients: the config and the trainer refuse it,
    naming the key and pointing at bfloat16."""
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.trainer import TrainerEngine

    with pytest.raises(ConfigError) as ei:
        load_config(empty_yaml, ["model.dtype=float16"])
    (problem,) = [p for p in ei.value.problems if p.startswith("model.dtype")]
    assert "float16" in problem and "bfloat16" in problem
    with pytest.raises(ValueError, match="model.dtype: 'float16'.*bfloat16"):
        TrainerEngine(str(tiny), lr=1e-3, weight_decay=0.0, loss=LossConfig(), micro_batch_size=2,
                      temperature=1.0, seed=0, dtype="float16")


def test_new_keys_validated(empty_yaml):
    cfg = load_config(empty_yaml)
    assert (cfg.train.loss_agg, cfg.train.truncated, cfg.train.adv_std, cfg.data.chat_template) == \
        ("token-mean-iteration", "zero_reward", "unbiased", "auto")
    with pytest.raises(ConfigError, match="train.loss_agg"):
        load_config(empty_yaml, ["train.loss_agg=token-sum"])
    with pytest.raises(ConfigError, match="train.truncated"):
        load_config(empty_yaml, ["train.truncated=drop"])


# ----------------------------------------------------------------- GRPO details (item 7)

def test_group_std_is_unbiased_like_verl():
    from asp_ascend.algos.grpo import group_advantages

    r = [1.0, 0.0, 0.0, 1.0]
    want = (np.asarray(r) - 0.5) / (np.std(r, ddof=1) + 1e-6)
    assert np.allclose(group_advantages(r), want)
    assert np.allclose(group_advantages(r, unbiased=False), [1, -1, -1, 1], atol=1e-4)


@pytest.mark.runtime
def test_clip_frac_counts_only_active_clipping():
    torch = pytest.importorskip("torch")
    from asp_ascend.algos.grpo import LossConfig, policy_loss

    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    mask = torch.ones(1, 2)
    cfg = LossConfig(off_policy="none", clip_eps=0.2)
    # ratio 2 with A < 0: the unclipped term is the min, clipping is inactive (verl: pg_losses2 > pg_losses)
    _, st = policy_loss(logp + np.log(2.0), logp, torch.tensor([-1.0]), mask, cfg)
    assert st["clipped"] == 0
    _, st = policy_loss(logp + np.log(2.0), logp, torch.tensor([1.0]), mask, cfg)
    assert st["clipped"] == 2


@pytest.mark.runtime
def test_k3_kl_clamped_like_verl():
    torch = pytest.importorskip("torch")
    from asp_ascend.algos.grpo import LossConfig, policy_loss

    logp = torch.tensor([[-0.1, -60.0]], requires_grad=True)
    ref = torch.tensor([[-0.1, -0.05]])  # the policy finds token 2 nearly impossible: exp(60) unclamped
    loss, st = policy_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 2),
                           LossConfig(off_policy="none", kl_coef=0.1), ref_logp=ref)
    assert np.isfinite(float(loss)) and st["kl"] <= 10.0
    loss.backward()
    assert torch.isfinite(logp.grad).all()


# ----------------------------------------------------------------- truncated answers (item 5)

def test_builtin_rewards_never_give_a_truncated_answer_full_credit():
    from asp_ascend.data.rewards import math_score
    from asp_ascend.data.synthetic import score

    assert score("3 4 5", "3 4 5") == 1.0
    assert score("3 4 5", "3 4 5", truncated=True) < 1.0
    assert math_score("so far 12 and 1", "1") == 1.0  # the last-number fallback...
    assert math_score("so far 12 and 1", "1", truncated=True) == 0.0  # ...is wherever the cut fell


@pytest.mark.parametrize("rule,want_rewards", [
    ("keep", [1.0, 0.5]),
    ("zero_reward", [1.0, 0.0]),
    ("mask", [1.0, 0.5]),  # scored as keep; the orchestrator takes the sample out of the loss
])
def test_truncated_rule(rule, want_rewards):
    from asp_ascend.data.synthetic import score
    from asp_ascend.pipeline.orchestrator import Prompts, Sampling, Task

    task = Task(Prompts({}, {}), score, lambda ids: " ".join(map(str, ids)), Sampling(2, 3, 1.0, 1.0, [0], 0),
                truncated=rule)
    samples = [{"token_ids": [3, 4, 5], "finish_reason": "stop"}, {"token_ids": [3, 4, 5], "finish_reason": "length"}]
    rewards = task.rewards(samples, "3 4 5")
    assert rewards[0] == want_rewards[0] and rewards[1] <= want_rewards[1] and rewards[1] < 1.0
    # a user's reward (text, answer) -> float is called as before
    plain = Task(Prompts({}, {}), lambda text, ans: 1.0, str, Sampling(2, 3, 1.0, 1.0, [0], 0), truncated=rule)
    assert plain.rewards(samples, "x") == ([1.0, 0.0] if rule == "zero_reward" else [1.0, 1.0])


# ----------------------------------------------------------------- loss aggregation (item 4)

def _iteration(n: int = 8, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        r = [rng.randrange(3, 19) for _ in range(2 + 3 * k)]  # very different lengths
        out.append({"prompt_ids": [rng.randrange(3, 19) for _ in range(3)], "response_ids": r,
                    "behav_logprobs": [-2.8] * len(r), "advantage": 0.01 * (-1) ** k})
    return out


def _total_gradient(trainer, mini_batches: list[list[dict]], denom) -> list:
    """Sum over the steps of each step's gradient (lr = 0: the weights stay put)."""
    total = None
    trainer.begin_iteration(0, len(mini_batches))
    for mb in mini_batches:
        st = trainer.train_step(mb, denom)
        assert st["grad_norm"] < 1.0  # no clipping: gradients add up as they are
        g = [p.grad.detach().clone() for p in trainer.model.parameters()]
        total = g if total is None else [a + b for a, b in zip(total, g)]
    return total


@pytest.mark.runtime
@pytest.mark.parametrize("agg", ["token-mean-iteration", "token-mean-step"])
def test_iteration_gradient_does_not_depend_on_the_mini_batch_split(tiny, agg):
    """ASP puts short samples in one mini-batch and long ones in another; token-mean-iteration
    gives every token of the iteration the same weight, so the iteration's total gradient is the
    same as for a shuffled split. token-mean-step (each step divides by its own tokens) is not."""
    import torch

    from asp_ascend.algos.grpo import LossConfig, iteration_denominator
    from asp_ascend.engines.trainer import TrainerEngine

    tr = TrainerEngine(str(tiny), lr=0.0, weight_decay=0.0, loss=LossConfig(off_policy="none", loss_agg=agg),
                       micro_batch_size=4, temperature=1.0, seed=0)
    samples = _iteration()
    by_length = sorted(samples, key=lambda s: len(s["response_ids"]))
    shuffled = samples[::2] + samples[1::2]
    denom = None
    if agg == "token-mean-iteration":  # the orchestrator's rule: one number for every step of the iteration
        denom = iteration_denominator(predicted_sum=40.0, prompts=4, group_size=2, mini_batches=2, max_tokens=64)
        assert denom == pytest.approx(40.0)
    a = _total_gradient(tr, [by_length[:4], by_length[4:]], denom)
    b = _total_gradient(tr, [shuffled[:4], shuffled[4:]], denom)
    same = all(torch.allclose(x, y, rtol=1e-4, atol=1e-9) for x, y in zip(a, b))
    assert same == (agg == "token-mean-iteration")


@pytest.mark.runtime
def test_masked_samples_add_nothing(tiny):
    """train.truncated=mask: a masked sample changes neither the gradient nor the step's divisor."""
    import torch

    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.trainer import TrainerEngine

    tr = TrainerEngine(str(tiny), lr=0.0, weight_decay=0.0, loss=LossConfig(off_policy="none", loss_agg="token-mean-step"),
                       micro_batch_size=4, temperature=1.0, seed=0)
    samples = _iteration(4)
    a = _total_gradient(tr, [samples[:3]], None)
    b = _total_gradient(tr, [samples[:3] + [{**samples[3], "masked": True, "advantage": 5.0}]], None)
    assert all(torch.allclose(x, y, rtol=1e-5, atol=1e-10) for x, y in zip(a, b))


# ----------------------------------------------------------------- fp32 master weights (item 2)

def _share_moved(dtype: str, tiny) -> tuple[float, object]:
    """Ten optimizer steps at lr 1e-6: the share of weight elements that changed."""
    import torch

    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.trainer import TrainerEngine

    tr = TrainerEngine(str(tiny), lr=1e-6, weight_decay=0.0, loss=LossConfig(off_policy="none"), micro_batch_size=8,
                       temperature=1.0, seed=0, dtype=dtype)
    before = [p.detach().clone() for p in tr.model.parameters()]
    samples = [{**s, "advantage": (-1.0) ** k} for k, s in enumerate(_iteration())]
    for i in range(10):
        tr.begin_iteration(i, 1)
        tr.train_step(samples)
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(tr.model.parameters(), before))
    return moved / sum(b.numel() for b in before), tr


@pytest.mark.runtime
def test_16bit_config_moves_as_many_weights_as_fp32(tiny):
    """model.dtype=bfloat16 keeps float32 master weights and AdamW state: ten small steps move the
    same share of weights as float32 (bf16 weights updated in place round most of them away);
    the instances still receive bf16 weights."""
    import torch

    from asp_ascend.platforms.transport import RayObjectStoreTransport

    full, _ = _share_moved("float32", tiny)
    half, tr = _share_moved("bfloat16", tiny)
    assert full > 0.9
    assert half >= 0.95 * full, (half, full)
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    assert all(v.dtype == torch.float32 for st in tr.opt.state.values() for v in st.values() if v.dim())
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        sent = dict(RayObjectStoreTransport().recv(tr.publish(10)))
    finally:
        if started:
            ray.shutdown()
    assert {t.dtype for t in sent.values() if t.is_floating_point()} == {torch.bfloat16}


# ----------------------------------------------------------------- KL reference on resume (item 3)

@pytest.mark.runtime
def test_resumed_trainer_keeps_the_kl_reference(tiny, tmp_path):
    """The KL reference is the policy of the run's first iteration, also after resume=true: a
    trainer resumed from a checkpoint computes the same KL as the uninterrupted one."""
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.trainer import TrainerEngine

    kw = dict(lr=1e-2, weight_decay=0.0, loss=LossConfig(off_policy="none", kl_coef=0.1), micro_batch_size=8,
              temperature=1.0, seed=0)
    samples = _iteration()
    tr = TrainerEngine(str(tiny), **kw)
    for i in range(2):
        tr.begin_iteration(i, 1)
        tr.train_step(samples)
    tr.save_checkpoint(str(tmp_path / "ck"), {"iteration": 2})
    tr.begin_iteration(2, 1)
    kl = tr.train_step(samples)["kl"]
    assert kl > 1e-4  # the policy moved away from its reference

    resumed = TrainerEngine(str(tmp_path / "ck"), **kw)
    assert resumed.load_checkpoint(str(tmp_path / "ck")) == 1
    resumed.begin_iteration(2, 1)
    assert resumed.train_step(samples)["kl"] == pytest.approx(kl, rel=1e-4)


# ----------------------------------------------------------------- top-p on CUDA (item 8)

@pytest.mark.gpu
@pytest.mark.parametrize("top_p", [0.3, 0.8, 0.95])
def test_trainer_nucleus_matches_vllm_sampler_on_cuda(top_p):
    """On CUDA with Triton, vLLM's sampler masks the nucleus with its Triton kernel
    (``apply_top_k_top_p`` -> ``apply_top_k_top_p_triton``), not the PyTorch rule the CPU test
    checks: the trainer's nucleus must drop exactly the tokens that kernel drops."""
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    from asp_ascend.algos.grpo import nucleus_drop_mask
    from asp_ascend.platforms import CudaPlatform

    if not CudaPlatform().is_available():
        pytest.skip("no CUDA device")
    dev = CudaPlatform().torch_device(0)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 1000, generator=g) * 3).to(dev)
    theirs = ops.apply_top_k_top_p(logits.clone(), None, torch.full((64,), top_p, device=dev))
    ours = logits.masked_fill(nucleus_drop_mask(logits, top_p), float("-inf"))
    assert torch.equal(torch.isinf(theirs), torch.isinf(ours))
    assert torch.allclose(ours.log_softmax(-1)[~torch.isinf(ours)], theirs.log_softmax(-1)[~torch.isinf(theirs)],
                          atol=1e-5)


# ----------------------------------------------------------------- chat template (item 7)

@pytest.mark.runtime
def test_chat_prompts_rendered_with_the_models_chat_template(tiny, tmp_path):
    """data.chat_template=auto: a chat-format prompt goes through the tokenizer's template
    (generation prompt included); none (or a tokenizer without a template) joins the contents."""
    import json

    from asp_ascend.data.datasets import encode_prompts, load_prompts
    from asp_ascend.engines.tiny_model import load_tokenizer

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "c", "prompt": [{"role": "user", "content": "a b"}]}) + "\n"
                 + json.dumps({"id": "s", "prompt": "a b"}) + "\n")
    ps = load_prompts(f)
    tok = load_tokenizer(tiny)
    plain = encode_prompts(tok, ps, "auto")
    assert plain["c"] == plain["s"] == tok("a b", add_special_tokens=False).input_ids  # no template
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} c {% endfor %}{% if add_generation_prompt %}d{% endif %}"
    chat = encode_prompts(tok, ps, "auto")
    assert chat["c"] == tok("a b c d", add_special_tokens=False).input_ids
    assert chat["s"] == plain["s"]  # plain strings are never templated
    assert encode_prompts(tok, ps, "none")["c"] == plain["c"]


@pytest.mark.slow
@pytest.mark.runtime
def test_16bit_fsdp_ranks_keep_float32_master_weights(tiny, tmp_path):
    """train.devices=2 with model.dtype=bfloat16: FSDP2's MixedPrecisionPolicy over float32 shards;
    ten lr-1e-6 steps move as many weights as one float32 trainer, the instances get bf16."""
    import os

    import torch
    from safetensors.torch import load_file

    ray = pytest.importorskip("ray")
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.fsdp_trainer import TrainerGroup
    from asp_ascend.platforms.transport import RayObjectStoreTransport

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cores = sorted(os.sched_getaffinity(0))
        group = TrainerGroup(str(tiny), 2, actor_options={"num_cpus": 0.5}, cores_per_rank=[[cores[0]], [cores[-1]]],
                             lr=1e-6, weight_decay=0.0, loss=LossConfig(off_policy="none"), micro_batch_size=8,
                             temperature=1.0, seed=0, dtype="bfloat16")
        samples = [{**s, "advantage": (-1.0) ** k} for k, s in enumerate(_iteration())]
        for i in range(10):
            ray.get(group.begin_iteration.remote(i, 1))
            ray.get(group.train_step.remote(samples))
        sent = dict(RayObjectStoreTransport().recv(ray.get(group.publish.remote(10))))
        ray.get(group.save_checkpoint.remote(str(tmp_path / "ck"), {"iteration": 10}))
        group.kill()
    finally:
        if started:
            ray.shutdown()
    assert {t.dtype for t in sent.values() if t.is_floating_point()} == {torch.bfloat16}
    after = load_file(str(tmp_path / "ck" / "model.safetensors"))
    before = load_file(str(tiny / "model.safetensors"))
    assert {v.dtype for v in after.values()} == {torch.float32}  # the checkpoint holds the master weights
    moved = sum(int((after[k] != before[k].to(after[k].dtype)).sum()) for k in before)
    assert moved / sum(v.numel() for v in before.values()) > 0.9
