"""Guided server choice through verl's load balancer, and the length history of a fully async run.

Pure rules first (no verl); then verl's ``GlobalRequestLoadBalancer`` subclass in process; then verl's
real fully async rollout path on a local Ray cluster: ``FullyAsyncRollouter.__init__`` /
``fit`` / ``_feed_samples`` / ``_processor_worker`` / ``_process_single_sample_streaming`` (our
AspRollouter), ``FullyAsyncAgentLoopManager`` with a real ``AgentLoopWorker`` actor running verl's
single-turn agent loop, ``FullyAsyncLLMServerClient``, the balancer created by verl's
``LLMServerManager._init_global_load_balancer`` from ``router_config_path``, and verl's
``MessageQueue``. The rollout servers are stand-ins (verl's vLLM servers need vLLM, which verl's
environment does not have, docs/verl.md): Ray actors with the server's ``generate`` signature that
return a deterministic number of tokens per prompt and record which requests they served.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from asp_ascend.integrations.verl.routing import (PRIORITY_BASE, choose_server, decode_instance, encode_priority,
                                                   priority_table)
from verl_fixtures import HAVE_VERL, SKIP_REASON, WORDS, ServerStandIn, base_overrides, response_length

ASP_CONFIG = Path(__file__).resolve().parents[2] / "asp_ascend" / "integrations" / "verl" / "config"
needs_verl = [pytest.mark.verl, pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)]


def test_priority_carries_instance_and_keeps_dispatch_order():
    ps = [encode_priority(pos, inst, 3) for pos, inst in [(0, 2), (1, 0), (2, 1), (3, 2)]]
    assert ps == sorted(ps) and all(p >= PRIORITY_BASE for p in ps)        # vLLM: lower first
    assert [decode_instance(p, 3) for p in ps] == [2, 0, 1, 2]
    assert decode_instance(0, 3) is None and decode_instance(17, 3) is None  # verl's own priorities
    with pytest.raises(ValueError):
        encode_priority(0, 3, 3)


def test_choose_server_guided_moves_only_to_a_server_with_room():
    loads = {"a": 2, "b": 0, "c": 1}
    assert choose_server("a", loads, cap=3) == "a"                 # room on the planned server
    assert choose_server("a", loads, cap=2) == "b"                 # full: the least-loaded takes the group
    assert choose_server("a", loads, cap=2, dispatch="static") == "a"
    assert choose_server("a", {"a": 2, "b": 2}, cap=2) == "a"      # all full: stays planned
    assert choose_server("gone", loads, cap=2) == "b" and choose_server(None, loads, cap=2) == "b"
    with pytest.raises(RuntimeError):
        choose_server("a", {}, cap=1)


def test_priority_table_follows_the_dispatch_order_across_epochs():
    import pandas as pd

    frame = pd.DataFrame({"prompt_id": ["4", "1", "7"], "instance": [1, 0, 1]})
    t = priority_table([7, 4, 1], frame, epoch=2, num_instances=2)
    assert t == {7: encode_priority(6, 1, 2), 4: encode_priority(7, 1, 2), 1: encode_priority(8, 0, 2)}


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_verls_balancer_subclass_routes_groups_to_their_instance():
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from asp_ascend.integrations.verl.router import AspLoadBalancer

    lb = AspLoadBalancer({"s0": "h0", "s1": "h1"}, {"num_instances": 2, "max_num_seqs": 2, "dispatch": "guided"})
    assert isinstance(lb, GlobalRequestLoadBalancer) and lb.require_acquire_fields() == ["priority"]
    g1, g2 = encode_priority(0, 1, 2), encode_priority(1, 1, 2)
    assert lb.acquire_server("a", priority=g1) == ("s1", "h1")
    assert lb.acquire_server("b", priority=g1)[0] == "s1"           # the sibling follows the group
    assert lb.acquire_server("c", priority=g2)[0] == "s0"           # s1 is full (cap 2), s0 has room
    assert lb.acquire_server("d", priority=0)[0] == "s0"            # verl's own choice (least in flight)
    lb.release_server("s1")
    assert lb.acquire_server("a", priority=g1)[0] == "s1"           # a partial-rollout resume: same server
    lb.remove_servers(["s1"])
    assert lb.acquire_server("e", priority=g1)[0] == "s0"           # its server left the pool
    st = lb.get_status()["asp"]
    assert st["groups"] == 3 and st["moved"] == 2
    static = AspLoadBalancer({"s0": "h0", "s1": "h1"}, {"num_instances": 2, "max_num_seqs": 1, "dispatch": "static"})
    assert [static.acquire_server(str(i), priority=g1)[0] for i in range(3)] == ["s1"] * 3


def _model(tmp_path):
    """The tiny Qwen2 model with a byte-level BPE tokenizer (no merges: one token per byte). verl's agent
    loop loads it with ``AutoTokenizer`` (which picks Qwen2's tokenizer class for this model type) and
    its Qwen continuous-token builder needs a newline token; the word-level test tokenizer has neither."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from asp_ascend.engines.tiny_model import build_tiny_model

    specials = ["<pad>", "<eos>", "<unk>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    model = build_tiny_model(specials + alphabet, tmp_path / "model", hidden_size=32, num_layers=1)
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(specials + alphabet)}, merges=[], unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(model)
    return model


def _fully_async_config(tmp_path, epochs: int):
    import os

    import verl.experimental.fully_async_policy as fa
    from hydra import compose, initialize_config_dir

    from asp_ascend.integrations.verl.main_ppo import fully_async_config

    ov = [o for o in base_overrides(tmp_path, n=24, batch=4, mini=4, epochs=epochs)
          if not o.startswith(("trainer.balance_batch", "trainer.use_v1", "data.train_batch_size"))]
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(fa.__file__), "config"), version_base=None):
        cfg = compose(config_name="fully_async_ppo_trainer", overrides=[
            f"hydra.searchpath=[pkg://verl.trainer.config,file://{ASP_CONFIG}]", "+asp=default",
            "asp.verl.mode=fully_async", "asp.verl.batch_layout=dispatch", *ov,
            f"actor_rollout_ref.model.path={_model(tmp_path)}", "data.train_batch_size=0",
            "actor_rollout_ref.rollout.calculate_log_probs=true", "async_training.trigger_parameter_sync_step=2",
            "async_training.staleness_threshold=1", "trainer.device=cpu", "actor_rollout_ref.hybrid_engine=false",
            "rollout.nnodes=1", "rollout.n_gpus_per_node=2", "actor_rollout_ref.rollout.agent.num_workers=1",
            "data.max_prompt_length=256", "actor_rollout_ref.rollout.name=vllm"])
    return fully_async_config(cfg)


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_fully_async_rollout_routes_groups_to_their_servers_and_records_lengths(tmp_path):
    """Two epochs through verl's fully async rollout path (module doc): every group goes to its schedule
    instance's server, the length history is written and consolidated, and the epoch-1 plan (adaptive)
    predicts the lengths observed in epoch 0."""
    import pandas as pd
    import ray
    import ray.cloudpickle as cloudpickle
    from verl.experimental.fully_async_policy.fully_async_rollouter import (FullyAsyncAgentLoopManager,
                                                                           FullyAsyncLLMServerManager)
    from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerManager

    from asp_ascend.integrations.verl.main_ppo import fully_async_runner_class, prepare
    from asp_ascend.integrations.verl.router import ROUTER_CLASS

    config = _fully_async_config(tmp_path, epochs=2)
    cfg, tok, asp = prepare(config)
    asp = cloudpickle.loads(cloudpickle.dumps(asp))
    assert cfg.rollout.num_instances == 2 and cfg.scheduler.adaptive and cfg.scheduler.dispatch == "guided"
    ro_cls = fully_async_runner_class().__ray_actor_class__.rollouter_class.__ray_actor_class__
    ro = ro_cls(config=config, tokenizer=tok, processor=None, device_name="cpu", asp=asp)   # verl's __init__
    router_yaml = Path(ro.config.actor_rollout_ref.rollout.router_config_path)
    assert router_yaml.parent == Path(cfg.output_dir).resolve() and ROUTER_CLASS in router_yaml.read_text()
    b = ro.asp_gate.b
    per_epoch = len(ro.asp_sampler.order(0))

    import os
    import sys

    here = Path(__file__).parent
    path = os.pathsep.join([str(here), str(here.parents[1]), *[p for p in sys.path if p]])
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        servers = [ray.remote(ServerStandIn).remote(f"s{i}") for i in range(2)]

        async def run():
            mgr = FullyAsyncLLMServerManager.__new__(FullyAsyncLLMServerManager)
            mgr.rollout_replica_class = ServerStandIn                # verl's replica class would start vLLM
            LLMServerManager.__init__(mgr, ro.config, None, None)
            mgr.hybrid_replicas, mgr.alive_replicas = {}, {}
            mgr.rollout_replicas, mgr.server_handles = ["r0", "r1"], servers
            mgr.server_addresses = ["10.0.0.1:8000", "10.0.0.2:8000"]
            await mgr._init_global_load_balancer()                   # verl's: reads router_config_path
            ro.llm_server_manager = mgr
            ro.async_rollout_manager = await FullyAsyncAgentLoopManager.create(
                config=ro.config, llm_client=mgr.get_client(client_cls=FullyAsyncLLMServerClient))
            ro._init_async_objects()
            queue = MessageQueueClient(MessageQueue.remote(ro.config, 64))
            await ro.set_message_queue_client(queue)
            await ro.set_max_required_samples()
            await ro.reset_staleness()                               # the trainer's sync before fit
            fit = asyncio.ensure_future(ro.fit())
            got = []
            while True:                                               # the trainer: b groups per version
                item = await queue.get_sample()
                if item is None or item[0] is None:
                    break
                got.append(cloudpickle.loads(item[0]))
                if len(got) % b == 0:
                    await ro.reset_staleness()
            await fit
            status = await mgr.global_load_balancer.get_status.remote()
            return got, status

        got, status = asyncio.run(run())
        logs = ray.get([s.log.remote() for s in servers])
    finally:
        ray.shutdown()

    assert len(got) == 2 * per_epoch
    frame = asp.frame
    assert sorted(frame["epoch"].unique()) == [0, 1]                 # epoch 1 planned during the run
    planned = {(int(r.epoch), int(r.prompt_id)): int(r.instance) for r in frame.itertuples()}
    served = {p: i for i, log in enumerate(logs) for p, _ in log}
    assert all(len(log) > 0 for log in logs)                         # the schedule uses both servers
    assert status["asp"]["moved"] == 0 and status["asp"]["groups"] == 2 * per_epoch
    groups = {}                                                      # every sample of a group: one server
    for i, log in enumerate(logs):
        for p, _ in log:
            groups.setdefault(p, set()).add(i)
    assert all(len(v) == 1 for v in groups.values()) and len(groups) == 2 * per_epoch
    for epoch in (0, 1):
        order = ro.asp_sampler.order(epoch)
        table = priority_table(order, frame[frame.epoch == epoch], epoch, 2)
        for pid, pr in table.items():
            assert served[pr] == planned[(epoch, pid)]

    hist = pd.read_parquet(Path(cfg.output_dir) / "length_history.parquet")
    assert set(hist.columns) >= {"prompt_id", "response_length", "epoch", "sample", "prompt_length", "step"}
    assert len(hist) == 2 * per_epoch * cfg.train.group_size and sorted(hist.epoch.unique()) == [0, 1]
    assert (hist.response_length == hist.prompt_length.astype(int).map(response_length)).all()
    assert sorted(hist.step.unique())[0] >= 0 and len(list((Path(cfg.output_dir) / "lengths").iterdir())) > 1
    # the adaptive re-plan of epoch 1 predicts the lengths epoch 0 produced, for the prompts seen by then
    observed = hist[hist.epoch == 0].groupby("prompt_id").response_length.mean()
    e1 = frame[frame.epoch == 1].set_index("prompt_id").predicted_length
    e0 = frame[frame.epoch == 0].set_index("prompt_id").predicted_length
    matched = [p for p in e1.index if abs(e1[p] - observed[p]) < 1e-6]
    assert len(matched) >= b and not any(abs(e0[p] - observed[p]) < 1e-6 for p in matched)
