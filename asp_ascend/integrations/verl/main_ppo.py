"""Entry point: verl's PPO/GRPO training with the ASP schedule.

    python -m asp_ascend.integrations.verl.main_ppo [verl overrides ...] [+asp=default] [+asp.KEY=VALUE ...]
    python -m asp_ascend.integrations.verl.main_ppo --config-path configs/verl --config-name grpo_qwen25_7b_asp_npu

The same Hydra config verl's ``python -m verl.trainer.main_ppo`` reads (default config
``asp_ppo_trainer`` = verl's ``ppo_trainer`` + the ``asp`` group). Steps: translate the
``asp:`` group (:mod:`.config_bridge`; every unsupported combination is an error naming the
key), start Ray with verl's runtime env (``verl.trainer.main_ppo.run_ppo``) and run
:class:`AspTaskRunner`, which builds verl's worker mapping with the helpers of verl's own
``TaskRunner``, plans (or reloads) the schedule and trains ``asp_trainer_class(RayPPOTrainer)``.
``asp.dry_run=true``: translate, plan and write ``output_dir`` (schedule.parquet, config.yaml), no Ray.
"""
from __future__ import annotations

import sys
from typing import Any

from ...errors import AspError


def prepare(config) -> tuple[Any, Any, Any]:
    """(our Config, verl tokenizer, VerlSchedule) for a composed verl config; plans if needed."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    from .config_bridge import translate
    from .plan import VerlSchedule, prompt_set_from_dataset

    raw = OmegaConf.to_container(config, resolve=True)
    cfg, _ = translate(raw, source="verl config (asp: group)")
    model: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer = model.tokenizer
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True,
                              max_samples=config.data.get("train_max_samples", -1))
    return cfg, tokenizer, VerlSchedule(cfg, prompt_set_from_dataset(train))


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

                raise ConfigError([f"asp.verl.mode: {mode} has no entry yet (sync and one_step_off do; fully async: "
                                   f"asp_ascend.integrations.verl.fully_async.asp_rollouter_class, docs/verl.md)"])
            from verl.trainer.ppo.ray_trainer import RayPPOTrainer
            from verl.trainer.ppo.utils import create_rl_dataset, need_critic, need_reference_policy
            from verl.utils.config import validate_config
            from verl.utils.dataset.rl_dataset import collate_fn

            from .trainer import asp_trainer_class

            OmegaConf.resolve(config)
            actor_rollout_cls, group_cls = self.add_actor_rollout_worker(config)
            self.add_critic_worker(config)
            self.add_reward_model_resource_pool(config)
            self.add_teacher_model_resource_pool(config)
            self.add_ref_policy_worker(config, actor_rollout_cls)
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
            cfg, tokenizer, asp = prepare(config)
            data = {split: create_rl_dataset(config.data[f"{split}_files"], config.data, tokenizer, None,
                                             is_train=split == "train",
                                             max_samples=config.data.get(f"{split}_max_samples", -1))
                    for split in ("train", "val")}
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
            from verl.trainer.ppo.utils import create_rl_dataset, need_critic, need_reference_policy
            from verl.utils.config import validate_config
            from verl.utils.dataset.rl_dataset import collate_fn

            from .trainer import asp_trainer_class

            OmegaConf.resolve(config)
            role_worker_mapping, group_cls = create_role_worker_mapping(config)
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
            cfg, tokenizer, asp = prepare(config)
            data = {split: create_rl_dataset(config.data[f"{split}_files"], config.data, tokenizer, None,
                                             is_train=split == "train",
                                             max_samples=config.data.get(f"{split}_max_samples", -1))
                    for split in ("train", "val")}
            trainer = asp_trainer_class(OneStepOffRayTrainer)(
                config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
                resource_pool_manager=create_resource_pool_manager(config, role_worker_mapping.keys()),
                ray_worker_group_cls=group_cls, train_dataset=data["train"], val_dataset=data["val"],
                collate_fn=collate_fn, device_name=config.trainer.device, asp=asp)
            trainer.init_workers()
            asyncio.run(trainer.fit())
            asp.recorder.consolidate()

    return ray.remote(num_cpus=1)(AspTaskRunner)


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
            if (config.get("asp") or {}).get("dry_run", False):
                from omegaconf import open_dict

                with open_dict(config):
                    config.asp.pop("dry_run")
                cfg, _, asp = prepare(config)
                print(f"asp verl: schedule {asp.path} ({len(asp.frame)} rows); config in {cfg.output_dir}")
                return
            mode = ((config.get("asp") or {}).get("verl") or {}).get("mode", "sync")
            if mode not in ("sync", "one_step_off"):
                from ...errors import ConfigError

                raise ConfigError([f"asp.verl.mode: {mode} has no entry yet (sync and one_step_off do); the fully "
                                   f"async rollouter is asp_ascend.integrations.verl.fully_async (docs/verl.md)"])
            run_ppo(config, task_runner_class=_task_runner_class())
        except AspError as exc:
            print(f"asp verl: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    _main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
