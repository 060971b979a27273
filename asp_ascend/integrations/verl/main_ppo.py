"""Entry point: verl's PPO/GRPO training with the ASP schedule.

    python -m asp_ascend.integrations.verl.main_ppo [verl overrides ...] [+asp=default] [+asp.KEY=VALUE ...]
    python -m asp_ascend.integrations.verl.main_ppo --config-path configs/verl --config-name grpo_qwen25_7b_asp_npu
    python -m asp_ascend.integrations.verl.main_ppo --config-path <verl>/experimental/fully_async_policy/config \
        --config-name fully_async_ppo_trainer +asp=default asp.verl.mode=fully_async asp.verl.batch_layout=dispatch

The same Hydra config verl's ``python -m verl.trainer.main_ppo`` reads (default config
``asp_ppo_trainer`` = verl's ``ppo_trainer`` + the ``asp`` group). Steps: translate the
``asp:`` group (:mod:`.config_bridge`; every unsupported combination is an error naming the
key), start Ray with verl's runtime env (``verl.trainer.main_ppo.run_ppo``) and run
:class:`AspTaskRunner`, which builds verl's worker mapping with the helpers of verl's own
``TaskRunner``, plans (or reloads) the schedule and trains ``asp_trainer_class(RayPPOTrainer)``.
``asp.verl.mode=fully_async`` (verl's ``fully_async_ppo_trainer`` config + the ``asp`` group; it sets
``hydra.searchpath`` itself, so it must be the primary config): verl's ``FullyAsyncTaskRunner`` with :class:`~.fully_async` ``AspRollouter`` in place
of ``FullyAsyncRollouter`` (:func:`fully_async_runner_class`).
``asp.dry_run=true``: translate, plan and write ``output_dir`` (schedule.parquet, config.yaml), no Ray.
"""
from __future__ import annotations

import sys
from typing import Any

from ...errors import AspError


def prepare(config) -> tuple[Any, Any, Any]:
    """(our Config, verl tokenizer, VerlSchedule) for a composed verl config; plans if needed."""
    cfg, tokenizer, asp, _ = _prepare(config)
    return cfg, tokenizer, asp


def _prepare(config) -> tuple[Any, Any, Any, Any]:
    """:func:`prepare` plus verl's train dataset it planned from (the trainer runs on that one)."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    from .config_bridge import translate
    from .plan import VerlSchedule, prompt_set_from_dataset

    raw = OmegaConf.to_container(config, resolve=True)
    cfg, _ = translate(raw, source="verl config (asp: group)")
    model: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer = model.tokenizer
    train = _dataset(config, tokenizer, "train")
    kwargs = config.data.get("apply_chat_template_kwargs") or {}
    prompts = prompt_set_from_dataset(train, tokenizer, OmegaConf.to_container(kwargs, resolve=True)
                                      if OmegaConf.is_config(kwargs) else dict(kwargs))
    return cfg, tokenizer, VerlSchedule(cfg, prompts), train


def _dataset(config, tokenizer, split: str):
    """verl's ``split`` ("train" or "val") dataset, built as its own task runners build it."""
    from verl.trainer.ppo.utils import create_rl_dataset

    return create_rl_dataset(config.data[f"{split}_files"], config.data, tokenizer, None, is_train=split == "train",
                             max_samples=config.data.get(f"{split}_max_samples", -1))


def _start(config) -> tuple[Any, Any, dict[str, Any]]:
    """What the sync and one-step-off runners do before building their trainer: verl's config
    check, the schedule, guided server choice; returns (tokenizer, VerlSchedule, datasets). The
    train dataset is the one the schedule was planned from (built once)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    cfg, tokenizer, asp, train = _prepare(config)
    _route(config, cfg, asp)
    return tokenizer, asp, {"train": train, "val": _dataset(config, tokenizer, "val")}


def _route(config, cfg, asp) -> None:
    """Guided server choice (``asp.verl.route_servers``): verl's load balancer becomes :mod:`.router`'s."""
    if cfg.verl.route_servers:
        from .router import install

        install(config, cfg, asp.out)


def _task_runner_class():
    import ray
    from verl.trainer.main_ppo_v0 import TaskRunner

    base = getattr(TaskRunner, "__ray_actor_class__", TaskRunner)

    class AspTaskRunner(base):
        """verl's TaskRunner helpers (worker mapping, resource pools) + the ASP trainer."""

        def run(self, config):
            from omegaconf import OmegaConf

            mode = ((config.get("asp") or {}).get("verl") or {}).get("mode", "sync")
            if mode == "one_step_off":
                return self.run_one_step_off(config)
            if mode != "sync":
                from ...errors import ConfigError

                raise ConfigError([f"asp.verl.mode: {mode} is not run by this task runner (sync, one_step_off); "
                                   f"fully_async runs through fully_async_runner_class (main() picks it)"])
            from verl.trainer.ppo.ray_trainer import RayPPOTrainer
            from verl.utils.dataset.rl_dataset import collate_fn

            from .trainer import asp_trainer_class

            OmegaConf.resolve(config)
            actor_rollout_cls, group_cls = self.add_actor_rollout_worker(config)
            self.add_critic_worker(config)
            self.add_reward_model_resource_pool(config)
            self.add_teacher_model_resource_pool(config)
            self.add_ref_policy_worker(config, actor_rollout_cls)
            tokenizer, asp, data = _start(config)
            trainer = asp_trainer_class(RayPPOTrainer)(
                config=config, tokenizer=tokenizer, role_worker_mapping=self.role_worker_mapping,
                resource_pool_manager=self.init_resource_pool_mgr(config), ray_worker_group_cls=group_cls,
                train_dataset=data["train"], val_dataset=data["val"], collate_fn=collate_fn, asp=asp)
            trainer.init_workers()
            trainer.fit()
            asp.recorder.consolidate()

        def run_one_step_off(self, config):
            """verl's one-step-off recipe (its OneStepTaskRunner's steps) with the ASP trainer hooks."""
            import asyncio

            from omegaconf import OmegaConf
            from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
            from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
            from verl.utils.dataset.rl_dataset import collate_fn

            from .trainer import asp_trainer_class

            OmegaConf.resolve(config)
            role_worker_mapping, group_cls = create_role_worker_mapping(config)
            tokenizer, asp, data = _start(config)
            trainer = asp_trainer_class(OneStepOffRayTrainer)(
                config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
                resource_pool_manager=create_resource_pool_manager(config, role_worker_mapping.keys()),
                ray_worker_group_cls=group_cls, train_dataset=data["train"], val_dataset=data["val"],
                collate_fn=collate_fn, device_name=config.trainer.device, asp=asp)
            trainer.init_workers()
            asyncio.run(trainer.fit())
            asp.recorder.consolidate()

    return ray.remote(num_cpus=1)(AspTaskRunner)


def fully_async_runner_class():
    """verl's ``FullyAsyncTaskRunner`` (undecorated, then ``ray.remote`` as verl does) whose rollouter is the
    ASP one: ``_create_rollouter`` plans (or reloads) the schedule and creates ``AspRollouter`` with verl's
    actor options and arguments plus ``asp=``; ``_initialize_components`` then gives the trainer the
    queue client that reports what it trains (:mod:`.consumed`); every other step (trainer, message queue, checkpoint
    loading, the sync before ``fit``, the training loop) is verl's."""
    import ray
    from verl.experimental.fully_async_policy.fully_async_main import FullyAsyncTaskRunner
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter

    from .fully_async import asp_rollouter_class

    rollouter_cls = ray.remote(**FullyAsyncRollouter._default_options)(asp_rollouter_class())

    class AspFullyAsyncTaskRunner(FullyAsyncTaskRunner.__ray_actor_class__):
        """verl's fully async task runner with the ASP rollouter."""

        rollouter_class = rollouter_cls

        def _create_rollouter(self, config) -> None:
            _, _, asp = prepare(config)
            self.components["asp"] = asp
            rollouter = self.rollouter_class.remote(
                config=config, tokenizer=self.components["tokenizer"], processor=self.components["processor"],
                device_name=config.trainer.device, asp=asp)
            if "hybrid_worker_group" in self.components:      # before init_workers, as verl requires
                ray.get(rollouter.set_hybrid_worker_group.remote(self.components["hybrid_worker_group"]))
            ray.get(rollouter.init_workers.remote())
            ray.get(rollouter.set_max_required_samples.remote())
            self.components["rollouter"] = rollouter

        def _initialize_components(self, config) -> None:
            super()._initialize_components(config)
            if self.components["asp"].cfg.verl.record_lengths:   # the length history follows what is trained
                from .consumed import ConsumptionClient

                client = ConsumptionClient(self.components["message_queue"], self.components["rollouter"])
                ray.get(self.components["trainer"].set_message_queue_client.remote(client))

    AspFullyAsyncTaskRunner.__name__ = AspFullyAsyncTaskRunner.__qualname__ = "AspFullyAsyncTaskRunner"
    return ray.remote(num_cpus=1)(AspFullyAsyncTaskRunner)


def fully_async_config(config):
    """verl's fully async entry's config steps (rollout node counts from ``rollout:``, legacy reward keys)."""
    from omegaconf import open_dict
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    if "async_training" not in config:
        from ...errors import ConfigError

        raise ConfigError(["asp.verl.mode: fully_async needs verl's fully async config (async_training:, rollout:); "
                           "start from verl's fully_async_ppo_trainer config (docs/verl.md)"])
    with open_dict(config):
        config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
        config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    return migrate_legacy_reward_impl(config)


def one_step_off_config(config):
    """verl's one-step-off entry's config step (``one_step_off_policy/main_ppo.main``): the rollout's node
    counts from the top-level ``rollout:`` group."""
    from omegaconf import open_dict

    if "rollout" not in config:
        from ...errors import ConfigError

        raise ConfigError(["asp.verl.mode: one_step_off needs verl's one-step-off config (rollout.nnodes, "
                           "rollout.n_gpus_per_node); start from verl's one_step_off_ppo_trainer config "
                           "(configs/verl/grpo_qwen25_7b_asp_one_step_off_*.yaml)"])
    with open_dict(config):
        config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
        config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    return config


def main(argv=None) -> int:
    from . import require_verl

    require_verl("python -m asp_ascend.integrations.verl.main_ppo")
    import hydra

    @hydra.main(config_path="config", config_name="asp_ppo_trainer", version_base=None)
    def _main(config) -> None:
        from verl.trainer.main_ppo import run_ppo
        from verl.utils.device import auto_set_device

        auto_set_device(config)
        try:
            mode = ((config.get("asp") or {}).get("verl") or {}).get("mode", "sync")
            if mode not in ("sync", "one_step_off", "fully_async"):
                from ...errors import ConfigError

                raise ConfigError([f"asp.verl.mode: unknown value {mode!r}; choose sync, one_step_off or fully_async"])
            if mode == "fully_async":
                config = fully_async_config(config)
            elif mode == "one_step_off":
                config = one_step_off_config(config)
            if (config.get("asp") or {}).get("dry_run", False):
                from omegaconf import open_dict

                with open_dict(config):
                    config.asp.pop("dry_run")
                cfg, _, asp = prepare(config)
                print(f"asp verl: schedule {asp.path} ({len(asp.frame)} rows); config in {cfg.output_dir}")
                return
            runner = fully_async_runner_class() if mode == "fully_async" else _task_runner_class()
            run_ppo(config, task_runner_class=runner)
        except AspError as exc:
            print(f"asp verl: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    _main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
