"""Real verl objects on CPU for the verl-marked tests (verl's config, dataset, trainer).

Only the actor worker group is a stand-in (:class:`ActorGroupStandIn`): verl's FSDP/Megatron
actor workers need accelerators. Everything the adapter touches -- Hydra composition,
``RLHFDataset``, ``collate_fn``, ``StatefulDataLoader``, ``RayPPOTrainer._create_dataloader``,
``_save_checkpoint`` / ``_load_checkpoint`` and ``DataProto`` -- is verl's own code.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest

HAVE_VERL = importlib.util.find_spec("verl") is not None
SKIP_REASON = ("verl is not installed in this environment; the verl-marked tests run in verl's own environment: "
               "ASP_STACK=verl bash ci/env.sh (ci/test.sh does it), then pytest -m verl")
needs_verl = [pytest.mark.verl, pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)]

WORDS = "what is one two three four five six seven eight nine plus minus equals".split()


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def model_dir(path: Path) -> Path:
    """The tiny Qwen2 model (``build_tiny_model``: random weights, a Qwen2-format tokenizer in which each
    of WORDS is one token) with a chat template, written to ``path``: what a verl run's
    ``actor_rollout_ref.model.path`` names. verl loads its tokenizer with its own ``hf_tokenizer``."""
    from transformers import AutoTokenizer

    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary

    model = build_tiny_model(task_vocabulary([" ".join(WORDS)]), path, hidden_size=32, num_layers=1)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(model)
    return model


_MODEL: list = []


def tokenizer():
    """verl's own loader (``verl.utils.hf_tokenizer``) on the tiny model directory (built once per process)."""
    import atexit
    import shutil
    import tempfile

    from verl.utils import hf_tokenizer

    if not _MODEL:
        root = tempfile.mkdtemp(prefix="asp-verl-model-")
        atexit.register(shutil.rmtree, root, True)
        _MODEL.append(model_dir(Path(root) / "model"))
    return hf_tokenizer(str(_MODEL[0]))


def prompt_tokens(text: str) -> int:
    """Token count of a dataset prompt after CHAT_TEMPLATE: one per word, one for the template's trailing space."""
    return len(text.split()) + 1


def write_dataset(path: Path, n: int) -> Path:
    """A verl-format parquet (chat ``prompt``, ``reward_model``, ``extra_info``) whose prompt lengths vary."""
    import pandas as pd

    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": " ".join(WORDS[: 1 + (i * 7) % 13])}],
             "reward_model": {"ground_truth": "one", "style": "rule"}, "extra_info": {"index": i}} for i in range(n)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def verl_config_dir() -> str:
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def compose(overrides: list[str], config_dir: str | None = None, config_name: str = "ppo_trainer"):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir or verl_config_dir(), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def base_overrides(tmp: Path, n: int = 40, batch: int = 8, mini: int = 4, group: int = 2, epochs: int = 2,
                   workers: int = 0) -> list[str]:
    data = write_dataset(tmp / "train.parquet", n)
    return ["trainer.use_v1=false", f"data.train_files={data}", f"data.val_files={data}",
            f"data.train_batch_size={batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
            f"actor_rollout_ref.rollout.n={group}", "trainer.balance_batch=false",
            f"data.dataloader_num_workers={workers}", f"trainer.default_local_dir={tmp / 'ckpt'}",
            "algorithm.adv_estimator=grpo", f"trainer.total_epochs={epochs}", "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.max_response_length=64"]


class ActorGroupStandIn:
    """Stands in for verl's actor worker group (accelerator-only): checkpoint calls write a marker, the update
    records the rows it was sent."""

    def __init__(self):
        self.saved, self.loaded, self.updated = [], [], []

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        Path(local_path, "actor.marker").write_text(str(global_step))
        self.saved.append(global_step)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(Path(local_path, "actor.marker").read_text())

    def update_actor(self, data):
        """The actor update's call (verl's ``_update_actor`` sends the no-padding TensorDict): the rows'
        ``uid`` order is kept, the metrics verl reads come back."""
        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu

        self.updated.append(list(tu.get(data, "uid")))
        out = TensorDict({}, batch_size=[])
        tu.assign_non_tensor(out, metrics={"mfu": 0.0, "pg_loss": 0.0})
        return out


class LocalHandle:
    """A Ray actor handle's ``handle.method.remote(...)`` on an object in this process (the call is made at
    once); ``calls`` lists ``(method, args)``."""

    def __init__(self, obj):
        self._obj, self.calls = obj, []

    def __getattr__(self, name):
        method = getattr(self._obj, name)
        handle = self

        class _Remote:
            @staticmethod
            def remote(*args, **kwargs):
                handle.calls.append((name, args))
                return method(*args, **kwargs)

        return _Remote()


def make_trainer(cfg_verl, asp_schedule, tok):
    """verl's RayPPOTrainer with the ASP hooks, datasets from verl's create_rl_dataset."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
    from verl.trainer.ppo.utils import Role, create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    from asp_ascend.integrations.verl.trainer import asp_trainer_class

    ds = create_rl_dataset(cfg_verl.data.train_files, cfg_verl.data, tok, None, is_train=True)
    cls = asp_trainer_class(RayPPOTrainer)
    tr = cls(config=cfg_verl, tokenizer=tok, role_worker_mapping={Role.ActorRollout: object},
             resource_pool_manager=ResourcePoolManager(resource_pool_spec={}, mapping={}),
             train_dataset=ds, val_dataset=ds, collate_fn=collate_fn, asp=asp_schedule)
    tr.actor_rollout_wg = ActorGroupStandIn()
    return tr


def train_dataset(cfg_verl, tok):
    from verl.trainer.ppo.utils import create_rl_dataset

    return create_rl_dataset(cfg_verl.data.train_files, cfg_verl.data, tok, None, is_train=True)


def response_length(prompt_len: int) -> int:
    """What the stand-in server generates for a prompt of ``prompt_len`` tokens."""
    return 2 + (3 * prompt_len) % 9


class ServerStandIn:
    """verl's rollout server's ``generate`` (token ids in, ``TokenOutput`` out) without an engine."""

    def __init__(self, name: str):
        self.name, self.served = name, []
        self.active = self.peak = 0         # requests generating at once, and the most seen

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
                       priority: int = 0, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.served.append((int(priority), len(prompt_ids)))
        n = min(response_length(len(prompt_ids)), int(sampling_params.get("max_tokens", 1 << 30)))
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(0.002 * n)
        finally:
            self.active -= 1
        return TokenOutput(token_ids=[3] * n, log_probs=[-0.5] * n, stop_reason="completed",
                           extra_fields={"global_steps": 0})

    def log(self):
        return self.served

    def most_at_once(self):
        return self.peak
