"""verl's real RayPPOTrainer on CPU with the ASP sampler: dataloader, batches, resume through
verl's checkpoint path (``_save_checkpoint`` / ``_load_checkpoint``), length history."""
from __future__ import annotations

import numpy as np
import pytest

from verl_fixtures import base_overrides, compose, make_trainer, needs_verl, tokenizer, train_dataset

pytestmark = needs_verl


def _asp(tmp_path, overrides, asp_overrides=()):
    from omegaconf import OmegaConf

    from asp_ascend.integrations.verl.config_bridge import translate
    from asp_ascend.integrations.verl.plan import VerlSchedule, prompt_set_from_dataset

    cfg_verl = compose(overrides)
    raw = OmegaConf.to_container(cfg_verl, resolve=True)
    cfg, _ = translate(raw, list(asp_overrides))
    tok = tokenizer()
    prompts = prompt_set_from_dataset(train_dataset(cfg_verl, tok), tok)
    return cfg_verl, VerlSchedule(cfg, prompts), tok


def _ids(batch) -> list[int]:
    return [int(e["asp_prompt_id"]) for e in batch["extra_info"]]


def _run(tr, start_step: int, stop_after: int | None = None) -> list[list[int]]:
    """verl's fit loop over the dataloader (epochs from global_steps), saving a checkpoint after
    step ``stop_after`` and stopping there, as a crash after a save would."""
    out = []
    steps = len(tr.train_dataloader)
    tr.global_steps = start_step + 1
    for _epoch in range(start_step // steps, tr.config.trainer.total_epochs):
        for batch in tr.train_dataloader:
            out.append(_ids(batch))
            if tr.global_steps == stop_after:
                tr._save_checkpoint()
                return out
            tr.global_steps += 1
    return out


def test_batches_are_the_schedule_iterations_laid_out_as_its_mini_batches(tmp_path):
    from asp_ascend.integrations.verl.layout import update_steps

    cfg_verl, asp, tok = _asp(tmp_path, base_overrides(tmp_path))
    tr = make_trainer(cfg_verl, asp, tok)
    tr.asp_sampler.set_trainer_dp(2)  # what init_workers sets from the actor group (2 ranks here)
    assert len(tr.train_dataloader) == 5
    batches = _run(tr, 0)
    assert len(batches) == 10
    sched = asp.frame
    for k, ids in enumerate(batches):
        epoch, it = divmod(k, 5)
        rows = sched[(sched.epoch == epoch) & (sched.iteration == sched[sched.epoch == epoch].iteration.min() + it)]
        assert sorted(ids) == sorted(rows.prompt_id.astype(int))
        steps = update_steps(ids, 4, 2)
        planned = [sorted(g.prompt_id.astype(int)) for _, g in rows.groupby("mini_batch")]
        assert [sorted(s) for s in steps] == planned
        # the mini-batches are length-homogeneous: predicted lengths do not interleave
        means = [rows[rows.prompt_id.astype(int).isin(s)].predicted_length.to_numpy() for s in steps]
        assert means[0].max() <= means[1].min() or means[1].max() <= means[0].min()


@pytest.mark.parametrize("stop", [3, 5, 7])
def test_resume_through_verls_checkpoint_continues_where_an_uninterrupted_run_would(tmp_path, stop):
    ov = base_overrides(tmp_path)
    cfg_verl, asp, tok = _asp(tmp_path, ov)
    reference = _run(make_trainer(cfg_verl, asp, tok), 0)

    ck = tmp_path / "run2"
    ck.mkdir()
    ov2 = [o if not o.startswith("trainer.default_local_dir") else f"trainer.default_local_dir={ck}" for o in ov]
    cfg_verl, asp, tok = _asp(tmp_path, ov2)
    first = make_trainer(cfg_verl, asp, tok)
    head = _run(first, 0, stop_after=stop)
    assert (ck / f"global_step_{stop}" / "data.pt").is_file()

    cfg_verl, asp2, tok = _asp(tmp_path, ov2 + ["trainer.resume_mode=auto"])
    second = make_trainer(cfg_verl, asp2, tok)
    second._load_checkpoint()                       # verl's own: global_steps, actor, data.pt
    assert second.global_steps == stop and second.actor_rollout_wg.loaded == [str(stop)]
    tail = _run(second, stop)
    assert head + tail == reference


def test_resume_with_dataloader_workers(tmp_path):
    ov = base_overrides(tmp_path, workers=2)
    cfg_verl, asp, tok = _asp(tmp_path, ov)
    reference = _run(make_trainer(cfg_verl, asp, tok), 0)
    head = _run(make_trainer(cfg_verl, asp, tok), 0, stop_after=4)
    cfg_verl, asp, tok = _asp(tmp_path, ov + ["trainer.resume_mode=auto"])
    second = make_trainer(cfg_verl, asp, tok)
    second._load_checkpoint()
    assert head + _run(second, 4) == reference


def test_length_history_from_verl_batches_feeds_the_adaptive_replan(tmp_path):
    import torch
    from verl import DataProto

    from asp_ascend.lengths.history import load_history

    ov = base_overrides(tmp_path)
    cfg_verl, asp, tok = _asp(tmp_path, ov, ["scheduler.adaptive=true"])
    assert sorted(asp.frame.epoch.unique()) == [0]          # epoch 1 is planned from observed lengths
    tr = make_trainer(cfg_verl, asp, tok)
    width, n = 6, 2
    tr.global_steps = 1
    for epoch in range(2):
        for batch_dict in tr.train_dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            ids = _ids(batch_dict)
            rows = batch.repeat(repeat_times=n, interleave=True)
            # the rollout's output as verl lays it out: left-padded prompt, right-padded response
            resp_len = torch.tensor([(pid * 3 + s) % width + 1 for pid in ids for s in range(n)])
            mask = torch.zeros(len(rows), 4 + width, dtype=torch.long)
            mask[:, 2:4] = 1
            for r, L in enumerate(resp_len.tolist()):
                mask[r, 4:4 + L] = 1
            out = DataProto.from_single_dict({"responses": torch.zeros(len(rows), width, dtype=torch.long),
                                              "attention_mask": mask})
            rows = rows.union(out)
            tr.asp_record(rows)
            tr.global_steps += 1
    hist = load_history(tmp_path / "ckpt" / "asp" / "length_history.parquet")
    assert len(hist) == 2 * 40 * n and set(hist.epoch) == {0, 1}
    h0 = hist[hist.epoch == 0]
    assert all(h0.response_length == (h0.prompt_id.astype(int) * 3 + h0["sample"]) % width + 1)
    assert (hist.prompt_length == 2).all()
    assert sorted(asp.frame.epoch.unique()) == [0, 1]      # re-planned when epoch 1 started
    e1 = asp.frame[asp.frame.epoch == 1].set_index("prompt_id").predicted_length
    want = h0.groupby("prompt_id").response_length.mean()
    assert np.allclose(e1.loc[want.index], want)


def test_one_step_off_trainer_feeds_the_schedule_iterations(tmp_path):
    """verl's OneStepOffRayTrainer (separate rollout, one version of lag) with the ASP hooks: its own
    _create_continuous_iterator walks the dataloader built around the sampler, and every batch is one
    schedule iteration laid out as its mini-batches, epoch after epoch."""
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import collate_fn

    from asp_ascend.integrations.verl.layout import update_steps
    from asp_ascend.integrations.verl.trainer import asp_trainer_class

    overrides = base_overrides(tmp_path) + ["actor_rollout_ref.hybrid_engine=false"]
    cfg_verl, asp, tok = _asp(tmp_path, overrides, ["verl.mode=one_step_off"])
    assert asp.cfg.pipeline.lag_bound == 1 and asp.cfg.pipeline.mode == "async"
    ds = train_dataset(cfg_verl, tok)
    tr = asp_trainer_class(OneStepOffRayTrainer)(
        config=cfg_verl, tokenizer=tok, role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=ResourcePoolManager(resource_pool_spec={}, mapping={}), train_dataset=ds,
        val_dataset=ds, collate_fn=collate_fn, asp=asp)
    tr.asp_sampler.set_trainer_dp(2)
    batches = [_ids(b) for _epoch, b in tr._create_continuous_iterator()]
    assert len(batches) == 10
    sched = asp.frame
    for k, ids in enumerate(batches):
        epoch, it = divmod(k, 5)
        rows = sched[(sched.epoch == epoch) & (sched.iteration == sched[sched.epoch == epoch].iteration.min() + it)]
        planned = [sorted(g.prompt_id.astype(int)) for _, g in rows.groupby("mini_batch")]
        assert [sorted(s) for s in update_steps(ids, 4, 2)] == planned


def test_training_batches_carry_their_groups_schedule_instance_to_the_balancer(tmp_path):
    """verl's own RayPPOTrainer._get_gen_batch (the batch verl's agent loops generate from) with our override:
    every row's priority decodes to its prompt's schedule instance (what AspLoadBalancer routes on) and
    follows the dispatch order; a validation batch (no ASP ids) keeps verl's priorities."""
    from verl import DataProto

    from asp_ascend.integrations.verl.routing import decode_instance

    cfg_verl, asp, tok = _asp(tmp_path, base_overrides(tmp_path))
    tr = make_trainer(cfg_verl, asp, tok)
    r = asp.cfg.rollout.num_instances
    sched = asp.frame
    tr.global_steps = 1
    for k, batch_dict in enumerate(tr.train_dataloader):
        batch = DataProto.from_single_dict(batch_dict)
        ids = [int(e["asp_prompt_id"]) for e in batch.non_tensor_batch["extra_info"]]
        gen = tr._get_gen_batch(batch)
        pr = gen.non_tensor_batch["priority"]
        planned = sched[sched.epoch == 0].set_index(sched[sched.epoch == 0].prompt_id.astype(int)).instance
        assert [decode_instance(p, r) for p in pr] == [int(planned[i]) for i in ids]
        assert len(set(pr)) == len(ids)                          # one priority per group
        if k == 1:
            break
    val = DataProto.from_single_dict(next(iter(tr.val_dataloader)))
    assert "priority" not in tr._get_gen_batch(val).non_tensor_batch


def _rollout(batch, n: int, width: int = 6):
    """verl's batch after generation (``fit``: repeat interleaved, union with the agent loop's output):
    left-padded 2-token prompts, right-padded responses of ``(prompt_id * 3 + sample) % width + 1`` tokens."""
    import torch
    from verl import DataProto

    rows = batch.repeat(repeat_times=n, interleave=True)
    ids = [int(e["asp_prompt_id"]) for e in rows.non_tensor_batch["extra_info"]]
    resp = [(pid * 3 + k % n) % width + 1 for k, pid in enumerate(ids)]
    mask = torch.zeros(len(rows), 4 + width, dtype=torch.long)
    mask[:, 2:4] = 1
    for r, length in enumerate(resp):
        mask[r, 4:4 + length] = 1
    out = DataProto.from_single_dict({
        "input_ids": torch.full((len(rows), 4 + width), 3, dtype=torch.long), "attention_mask": mask,
        "position_ids": torch.clamp(torch.cumsum(mask, -1) - 1, min=0), "responses": torch.full((len(rows), width), 3),
        "response_mask": mask[:, 4:].clone()})
    return rows.union(out), resp


@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
def test_each_trained_batch_is_recorded_and_its_groups_reported_to_the_balancer(tmp_path, mode):
    """verl's own update path -- ``RayPPOTrainer._update_actor`` (sync ``fit``) and, one-step-off,
    ``SeparateRayPPOTrainer._fit_update_actor`` -- on batches made as verl's ``fit`` makes them (uid, then
    ``_get_gen_batch``): every trained batch's lengths are in its step's history part, and every group's
    lengths reach the balancer under the priority it was generated with. One-step-off order: batch k+1 is
    generated (the next epoch's, at the epoch boundary) before batch k is trained."""
    import uuid

    from verl import DataProto
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager, RayPPOTrainer
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import collate_fn

    from asp_ascend.integrations.verl.router import AspLoadBalancer, router_settings
    from asp_ascend.integrations.verl.trainer import asp_trainer_class
    from verl_fixtures import ActorGroupStandIn, LocalHandle

    n = 2
    ov = base_overrides(tmp_path, n=16, batch=4, mini=2)
    extra = ["verl.mode=one_step_off"] if mode == "one_step_off" else []
    if mode == "one_step_off":
        ov.append("actor_rollout_ref.hybrid_engine=false")
    cfg_verl, asp, tok = _asp(tmp_path, ov, extra)
    assert asp.cfg.verl.route_servers and asp.cfg.verl.record_lengths
    ds = train_dataset(cfg_verl, tok)
    base = OneStepOffRayTrainer if mode == "one_step_off" else RayPPOTrainer
    tr = asp_trainer_class(base)(config=cfg_verl, tokenizer=tok, role_worker_mapping={Role.ActorRollout: object},
                                 resource_pool_manager=ResourcePoolManager(resource_pool_spec={}, mapping={}),
                                 train_dataset=ds, val_dataset=ds, collate_fn=collate_fn, asp=asp)
    tr.asp_sampler.set_trainer_dp(2)
    tr.actor_rollout_wg = ActorGroupStandIn()
    lb = LocalHandle(AspLoadBalancer({"s0": None, "s1": None}, router_settings(asp.cfg)))
    tr.llm_server_manager = type("LLMServerManagerStandIn", (), {"global_load_balancer": lb})()
    tr.metrics, tr.timing_raw = {}, {}

    generated = []                              # (batch after generation, {priority: its rows' lengths})

    def generate(epoch, batch_dict):            # what fit / _async_gen_next_batch do before generating
        batch = DataProto.from_single_dict(batch_dict)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen = tr._get_gen_batch(batch)
        rows, resp = _rollout(batch, n)
        groups = {}
        for p, length in zip(gen.non_tensor_batch["priority"].repeat(n), resp):
            groups.setdefault(int(p), []).append(length)
        generated.append((rows, groups))

    def train(step):
        tr.global_steps = step
        rows = generated[step - 1][0]
        if mode == "one_step_off":
            tr._fit_update_actor(rows)
        else:
            tr._update_actor(rows)

    if mode == "one_step_off":
        batches = tr._create_continuous_iterator()          # verl's, over the dataloader, epoch after epoch
        generate(*next(batches))
        for step in range(1, 9):                            # 16 prompts / 4 per batch x 2 epochs
            if step < 8:
                generate(*next(batches))                    # the next batch starts before this one trains
            train(step)
        assert next(batches, None) is None
    else:
        step = 0
        for epoch in range(2):
            for batch_dict in tr.train_dataloader:
                step += 1
                generate(epoch, batch_dict)
                train(step)
        assert step == 8

    from asp_ascend.integrations.verl.routing import decode_priority

    reports = [r for name, args in lb.calls if name == "report_groups" for r in args[0]]
    want = {p: lengths for _, groups in generated for p, lengths in groups.items()}
    assert len(reports) == 8 * 4 and dict(reports) == want           # every group once, with its lengths
    positions = sorted(decode_priority(p, asp.cfg.rollout.num_instances).position for p, _ in reports)
    assert positions == list(range(32))         # epoch 0's 16 dispatch positions, then epoch 1's
    assert lb._obj.routes.estimator._err.n == 32 and not tr.asp_routed
    assert [len(u) for u in tr.actor_rollout_wg.updated] == [8] * 8
    parts = sorted((tmp_path / "ckpt" / "asp" / "lengths").glob("step_*.parquet"))
    assert len(parts) == 8
    import pandas as pd

    for step, (rows, groups) in enumerate(generated, start=1):
        part = pd.read_parquet(parts[step - 1])
        assert (part.step == step).all() and sorted(part.response_length) == sorted(sum(groups.values(), []))
