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

from asp_ascend.integrations.verl.routing import (LENGTH_SPAN, PRIORITY_BASE, GuidedRoutes, Route, decode_instance,
                                                   decode_priority, encode_priority, priority_table)
from verl_fixtures import (HAVE_VERL, SKIP_REASON, WORDS, ServerStandIn, base_overrides, model_dir, prompt_tokens,
                           response_length)

ASP_CONFIG = Path(__file__).resolve().parents[2] / "asp_ascend" / "integrations" / "verl" / "config"
needs_verl = [pytest.mark.verl, pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)]


def test_priority_carries_position_instance_and_length_and_keeps_dispatch_order():
    ps = [encode_priority(pos, inst, 3, L) for pos, inst, L in [(0, 2, 900), (1, 0, 5), (2, 1, 0), (3, 2, 1e9)]]
    assert ps == sorted(ps) and all(p >= PRIORITY_BASE for p in ps)        # vLLM: lower first
    assert [decode_instance(p, 3) for p in ps] == [2, 0, 1, 2]
    assert [tuple(decode_priority(p, 3)) for p in ps] == [(0, 2, 900), (1, 0, 5), (2, 1, 0), (3, 2, LENGTH_SPAN - 1)]
    assert decode_instance(0, 3) is None and decode_instance(17, 3) is None  # verl's own priorities
    assert max(ps) < 2 ** 63                                               # fits verl's int64 column
    with pytest.raises(ValueError):
        encode_priority(0, 3, 3)


def _arrive(routes, key, instance, length, position=None):
    return routes.arrive(key, Route(key if position is None else position, instance, length))


def test_guided_own_group_first_then_the_most_loaded_instances_group():
    """DESIGN 9a by hand: 3 instances, one group in flight each (slots 1), groups of 2."""
    routes = GuidedRoutes(3, group_slots=1, group_size=2)
    assert _arrive(routes, 0, 0, 1000) == [(0, 0)]       # each instance takes its own group
    assert _arrive(routes, 1, 1, 10) == [(1, 1)]
    assert _arrive(routes, 2, 2, 10) == [(2, 2)]
    assert _arrive(routes, 3, 0, 100) == []              # every instance is full: the groups wait
    assert _arrive(routes, 4, 1, 100) == []
    assert routes.waiting() == 2
    # instance 2 frees up with nothing of its own: it takes the waiting group of the instance with the
    # most remaining work -- instance 0 (a 1000-token group running + 100 waiting) over instance 1 (10 + 100)
    # -- as the steal lowers the later finish: instance 2's 0 + 100 < instance 0's 100 + (> 1000)
    assert routes.remaining_work(0) > 1100 > routes.remaining_work(1) > 110
    assert routes.finished(2) == [(3, 2)]
    assert routes.steals == [(3, 0, 2)]
    assert routes.finished(1) == [(4, 1)]                # instance 1 takes its own waiting group
    assert routes.waiting() == 0


def test_guided_takes_its_own_group_before_helping_and_the_fewest_loaded_helps_first():
    routes = GuidedRoutes(3, group_slots=2, group_size=2)
    assert [_arrive(routes, k, 0, 50)[0] for k in range(2)] == [(0, 0), (1, 0)]
    assert _arrive(routes, 2, 1, 50) == [(2, 1)]
    # instance 0 is full; instance 2 (no group in flight) helps before instance 1 (one in flight)
    assert _arrive(routes, 3, 0, 50) == [(3, 2)]
    assert _arrive(routes, 4, 0, 50) == [(4, 1)]         # instances 1 and 2 now hold one each: index order
    assert _arrive(routes, 5, 2, 50) == [(5, 2)]         # instance 2's own group: it still has a slot


def test_static_runs_exactly_the_planned_groups():
    routes = GuidedRoutes(2, group_slots=1, group_size=2, dispatch="static")
    assert _arrive(routes, 0, 0, 10) == [(0, 0)]
    assert _arrive(routes, 1, 0, 10) == []               # instance 1 is idle, but static never moves a group
    assert routes.finished(0) == [(1, 0)] and routes.steals == []


def test_waiting_groups_go_in_dispatch_order_and_a_gone_servers_groups_move():
    routes = GuidedRoutes(2, group_slots=1, group_size=2, dispatch="static")
    assert _arrive(routes, 10, 0, 10, position=0) == [(10, 0)]
    assert _arrive(routes, 12, 0, 10, position=2) == []
    assert _arrive(routes, 11, 0, 10, position=1) == []   # arrived later, planned earlier
    assert routes.finished(10) == [(11, 0)]
    assert _arrive(routes, 13, 1, 10, position=3) == [(13, 1)]
    # instance 0's server leaves: its running group 11 and waiting group 12 go to instance 1 and wait there
    assert routes.server_gone(0) == []
    assert routes.finished(13) == [(11, 1)]
    assert routes.finished(11) == [(12, 1)]


def test_reported_lengths_teach_the_estimator_its_bias():
    routes = GuidedRoutes(2, group_slots=1, group_size=2)
    _arrive(routes, 0, 0, 100)
    before = routes.remaining_work(0)
    for k in range(1, 9):                                 # groups that ran 4x longer than predicted
        _arrive(routes, k, 1, 100)
        routes.finished(k, lengths=[400, 400])
    # 8 groups against the 8 prior pseudo-groups: half the log-error, about 2x (the estimator's shrinkage)
    assert 1.7 * before < routes.remaining_work(0) < 2.3 * before


def test_priority_table_follows_the_dispatch_order_across_epochs():
    import pandas as pd

    frame = pd.DataFrame({"prompt_id": ["4", "1", "7"], "instance": [1, 0, 1], "predicted_length": [3.0, 8.0, 5.0]})
    t = priority_table([7, 4, 1], frame, epoch=2, num_instances=2)
    assert t == {7: encode_priority(6, 1, 2, 5), 4: encode_priority(7, 1, 2, 3), 1: encode_priority(8, 0, 2, 8)}


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_verls_balancer_subclass_holds_a_group_until_an_instance_admits_it():
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from asp_ascend.integrations.verl.router import AspLoadBalancer

    conf = {"num_instances": 2, "group_slots": 1, "group_size": 2, "dispatch": "guided"}
    g = [encode_priority(p, i, 2, 50) for p, i in [(0, 1), (1, 1), (2, 0), (3, 0)]]

    async def run():
        lb = AspLoadBalancer({"s0": "h0", "s1": "h1"}, conf)
        assert isinstance(lb, GlobalRequestLoadBalancer) and lb.require_acquire_fields() == ["priority"]
        assert await lb.acquire_server("a0", priority=g[0]) == ("s1", "h1")
        assert (await lb.acquire_server("a1", priority=g[0]))[0] == "s1"   # the sibling follows the group
        # s1 full: idle s0 takes it (9a): s0's work 0 + 50 < s1's 50 waiting + group 0's re-estimated
        # remaining (a 50-token prediction, nothing done yet: > 0)
        assert (await lb.acquire_server("b0", priority=g[1]))[0] == "s0"
        c = asyncio.ensure_future(lb.acquire_server("c0", priority=g[2]))  # both full: it waits
        await asyncio.sleep(0.01)
        assert not c.done() and lb.get_status()["asp"]["waiting"] == 1
        assert (await lb.acquire_server("v", priority=0))[0] in ("s0", "s1")   # verl's own request: verl's choice
        lb.release_server("s1", "a0")
        await asyncio.sleep(0.01)
        assert not c.done()                                # one sample of group 0 is still running
        # group 0 is done: s1 (nothing of its own, work 0) takes s0's waiting group 2, as 0 + 50 < s0's
        # 50 waiting + group 1's re-estimated remaining (> 0)
        lb.release_server("s1", "a1")
        assert (await c)[0] == "s1"
        assert (await lb.acquire_server("a1", priority=g[0]))[0] == "s1"   # a partial-rollout resume: same server
        lb.remove_servers(["s0"])                          # group 1's server leaves: it waits for s1
        b = asyncio.ensure_future(lb.acquire_server("b0", priority=g[1]))
        await asyncio.sleep(0.01)
        assert not b.done()
        for rid in ("c0", "a1"):
            lb.release_server("s1", rid)
        lb.release_server("s1", "c1-never-acquired")
        st = lb.get_status()["asp"]
        return st

    st = asyncio.run(run())
    assert st["groups"] == 3 and st["moved"] == 2 and st["steals"] == [(g[1], 1, 0), (g[2], 0, 1)]

    async def static():
        lb = AspLoadBalancer({"s0": "h0", "s1": "h1"}, {**conf, "dispatch": "static"})
        await lb.acquire_server("a0", priority=g[0])
        b = asyncio.ensure_future(lb.acquire_server("b0", priority=g[1]))
        await asyncio.sleep(0.01)
        return b.done()

    assert asyncio.run(static()) is False                  # static: group 1 waits for its own s1


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
            f"actor_rollout_ref.model.path={model_dir(tmp_path / 'model')}", "data.train_batch_size=0",
            "actor_rollout_ref.rollout.calculate_log_probs=true", "async_training.trigger_parameter_sync_step=2",
            "async_training.staleness_threshold=1", "trainer.device=cpu", "actor_rollout_ref.hybrid_engine=false",
            "rollout.nnodes=1", "rollout.n_gpus_per_node=2", "actor_rollout_ref.rollout.agent.num_workers=1",
            "data.max_prompt_length=256", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.max_num_seqs=4"])      # 2 groups of 2 in flight per server
    return fully_async_config(cfg)


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_fully_async_rollout_routes_groups_to_their_servers_and_records_lengths(tmp_path):
    """Two epochs through verl's fully async rollout path (module doc): no server runs more than its 2 group
    slots at once (groups wait in the balancer), every group runs on its schedule instance's server or on
    the one that took it by guided dispatch, the trainer's queue client (ConsumptionClient) reports what it
    takes and the length history holds exactly that, and the epoch-1 plan (adaptive) predicts the lengths
    observed in epoch 0."""
    import pandas as pd
    import ray
    import ray.cloudpickle as cloudpickle
    from verl.experimental.fully_async_policy.fully_async_rollouter import (FullyAsyncAgentLoopManager,
                                                                           FullyAsyncLLMServerManager)
    from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerManager

    from asp_ascend.integrations.verl.consumed import ConsumptionClient
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
            trainer_queue = ConsumptionClient(queue.queue_actor, ro)   # what the runner gives verl's trainer
            await ro.set_max_required_samples()
            await ro.reset_staleness()                               # the trainer's sync before fit
            fit = asyncio.ensure_future(ro.fit())
            got = []
            while True:                                               # the trainer: b groups per version
                item = await trainer_queue.get_sample()
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
        peaks = ray.get([s.most_at_once.remote() for s in servers])
    finally:
        ray.shutdown()

    assert len(got) == 2 * per_epoch
    frame = asp.frame
    assert sorted(frame["epoch"].unique()) == [0, 1]                 # epoch 1 planned during the run
    planned = {(int(r.epoch), int(r.prompt_id)): int(r.instance) for r in frame.itertuples()}
    served = {p: i for i, log in enumerate(logs) for p, _ in log}
    assert all(len(log) > 0 for log in logs)                         # the schedule uses both servers
    assert max(peaks) <= 4                                           # 2 group slots x 2 samples per server
    assert status["asp"]["groups"] == 2 * per_epoch and status["asp"]["waiting"] == 0
    stolen = {int(p): int(to) for p, _, to in status["asp"]["steals"]}
    assert status["asp"]["moved"] == len(stolen)
    groups = {}                                                      # every sample of a group: one server
    for i, log in enumerate(logs):
        for p, _ in log:
            groups.setdefault(p, set()).add(i)
    assert all(len(v) == 1 for v in groups.values()) and len(groups) == 2 * per_epoch
    for epoch in (0, 1):
        order = ro.asp_sampler.order(epoch)
        table = priority_table(order, frame[frame.epoch == epoch], epoch, 2)
        for pid, pr in table.items():
            assert served[pr] == stolen.get(pr, planned[(epoch, pid)])

    hist = pd.read_parquet(Path(cfg.output_dir) / "length_history.parquet")
    assert set(hist.columns) >= {"prompt_id", "response_length", "epoch", "sample", "prompt_length", "step"}
    assert len(hist) == 2 * per_epoch * cfg.train.group_size and sorted(hist.epoch.unique()) == [0, 1]
    assert (hist.response_length == hist.prompt_length.astype(int).map(response_length)).all()
    # verl's agent loop tokenized each prompt with the model directory's own tokenizer: one token per word
    # (plus the chat template's trailing space), as AutoTokenizer loads it in verl's transformers
    words = {i: " ".join(WORDS[: 1 + (i * 7) % 13]) for i in range(24)}
    assert (hist.prompt_length == hist.prompt_id.astype(int).map(lambda i: prompt_tokens(words[i]))).all()
    # the plan counted the same tokens for every prompt (main_ppo: verl's tokenizer over the rendered messages)
    planned = dict(zip(map(int, asp.prompts.ids), asp.prompts.prompt_lengths))
    assert (hist.prompt_length == hist.prompt_id.astype(int).map(planned)).all()
    assert asp.prompts.length_unit["unit"] == "tokens"
    assert sorted(hist.step.unique())[0] >= 0 and len(list((Path(cfg.output_dir) / "lengths").iterdir())) > 1
    # the adaptive re-plan of epoch 1 predicts the lengths epoch 0 produced, for the prompts seen by then
    observed = hist[hist.epoch == 0].groupby("prompt_id").response_length.mean()
    e1 = frame[frame.epoch == 1].set_index("prompt_id").predicted_length
    e0 = frame[frame.epoch == 0].set_index("prompt_id").predicted_length
    matched = [p for p in e1.index if abs(e1[p] - observed[p]) < 1e-6]
    assert len(matched) >= b and not any(abs(e0[p] - observed[p]) < 1e-6 for p in matched)
