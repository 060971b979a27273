"""The fully async entry: our config (verl's fully_async_ppo_trainer + the asp group) composes and
translates, verl's fully async task runner is the base of ours, and its rollouter -- built with verl's
actor options -- is the ASP one, constructed here with verl's own ``__init__`` on CPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from verl_fixtures import HAVE_VERL, SKIP_REASON, WORDS, base_overrides, model_dir, prompt_tokens

ASP_CONFIG = Path(__file__).resolve().parents[2] / "asp_ascend" / "integrations" / "verl" / "config"
pytestmark = [pytest.mark.verl, pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)]


def _config(tmp_path, extra=()):
    import os

    import verl.experimental.fully_async_policy as fa
    from hydra import compose, initialize_config_dir

    ov = [o for o in base_overrides(tmp_path, n=24, batch=4, mini=4, epochs=1)
          if not o.startswith(("trainer.balance_batch", "trainer.use_v1", "data.train_batch_size"))]
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(fa.__file__), "config"), version_base=None):
        return compose(config_name="fully_async_ppo_trainer",
                       overrides=[f"hydra.searchpath=[pkg://verl.trainer.config,file://{ASP_CONFIG}]", "+asp=default",
                                  "asp.verl.mode=fully_async", "asp.verl.batch_layout=dispatch", *ov, f"actor_rollout_ref.model.path={model_dir(tmp_path / 'model')}", "data.train_batch_size=0",
                                  "actor_rollout_ref.rollout.calculate_log_probs=true",
                                  "async_training.trigger_parameter_sync_step=2",
                                  "async_training.staleness_threshold=1", "trainer.device=cpu", "actor_rollout_ref.hybrid_engine=false", *extra])


def test_fully_async_entry_builds_verls_runner_with_the_asp_rollouter(tmp_path):
    import ray.cloudpickle as cloudpickle
    from verl.experimental.fully_async_policy.fully_async_main import FullyAsyncTaskRunner
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter

    from asp_ascend.integrations.verl.fully_async import AdmissionQueue
    from asp_ascend.integrations.verl.main_ppo import fully_async_config, fully_async_runner_class, prepare
    from asp_ascend.integrations.verl.sampler import AspSampler

    config = fully_async_config(_config(tmp_path))
    assert config.asp.verl.mode == "fully_async"
    assert config.actor_rollout_ref.rollout.nnodes == config.rollout.nnodes
    runner = fully_async_runner_class()
    base = FullyAsyncTaskRunner.__ray_actor_class__
    assert issubclass(runner.__ray_actor_class__, base)
    assert runner.__ray_actor_class__._create_rollouter is not base._create_rollouter
    ro_cls = runner.__ray_actor_class__.rollouter_class
    assert ro_cls._default_options == FullyAsyncRollouter._default_options       # verl's actor options
    assert issubclass(ro_cls.__ray_actor_class__, FullyAsyncRollouter.__ray_actor_class__)

    cfg, tok, asp = prepare(config)
    # the tokenizer verl's HFModelConfig loaded from model.path encodes each word as one token
    text = tok.apply_chat_template([{"role": "user", "content": " ".join(WORDS[:5])}], tokenize=False)
    assert len(tok.encode(text, add_special_tokens=False)) == prompt_tokens(" ".join(WORDS[:5])) == 6
    asp = cloudpickle.loads(cloudpickle.dumps(asp))                                # it travels to the actor
    assert cfg.train.global_batch_size == 4 * 2                                    # mini x trigger = one version
    ro = ro_cls.__ray_actor_class__(config=config, tokenizer=tok, processor=None, device_name="cpu", asp=asp)
    assert isinstance(ro.train_dataloader.sampler, AspSampler) and ro.asp_sampler is ro.train_dataloader.sampler
    assert isinstance(ro.pending_queue, AdmissionQueue) and ro.asp_gate.b == 8
    ids = [int(b["extra_info"][0]["asp_prompt_id"]) for b in ro.train_dataloader]
    assert ids == [int(p) for p in ro.asp_sampler.order(0)]


def test_fully_async_mode_without_verls_async_config_is_an_error_naming_the_key(tmp_path):
    from hydra import compose, initialize_config_dir

    from asp_ascend.errors import ConfigError
    from asp_ascend.integrations.verl.main_ppo import fully_async_config

    with initialize_config_dir(config_dir=str(ASP_CONFIG), version_base=None):
        cfg = compose(config_name="asp_ppo_trainer", overrides=base_overrides(tmp_path) + ["asp.verl.mode=fully_async"])
    with pytest.raises(ConfigError, match="fully_async_ppo_trainer"):
        fully_async_config(cfg)
