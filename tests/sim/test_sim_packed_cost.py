"""The simulator's packed trainer cost (sim/costs.py PACKED_TOKEN_COST, calibrated by
benchmarks/bench_packing.py): a packed micro-batch pays PACKED_TOKEN_COST padded slots per real
token, a padded or sorted one every slot; the lower bound's trainer term prices them the same way."""
import numpy as np
import pytest

from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.execution import ExecutionSettings
from asp_ascend.sim.bounds import lower_bounds
from asp_ascend.sim.costs import PACKED_TOKEN_COST, trainer_slots
from asp_ascend.sim.engine import Engine, SimJobs, TrainerSpec
from asp_ascend.sim.trainer import micro_batch_table

UNIT = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0)


def _jobs(resp):
    resp = np.asarray(resp, dtype=np.int64)
    J = resp.shape[0]
    return SimJobs(epoch=np.zeros(J, np.int64), prompt_id=np.array([f"p{i}" for i in range(J)], dtype=object),
                   iteration=np.zeros(J, np.int64), mini_batch=np.zeros(J, np.int64), instance=np.zeros(J, np.int64),
                   dispatch_rank=np.arange(J, dtype=np.int64), prompt_length=np.ones(J, np.int64), resp=resp)


def test_calibrated_value_and_slots():
    assert 1.0 <= PACKED_TOKEN_COST <= 1.3  # bench_packing: 1.11 +- 0.05 on the CPU trainer
    assert trainer_slots([10, 4], [6, 0], "padded").tolist() == [16.0, 4.0]
    assert trainer_slots([10, 4], [6, 0], "sorted").tolist() == [16.0, 4.0]
    assert trainer_slots([10, 4], [6, 0], "packed") == pytest.approx([10 * PACKED_TOKEN_COST, 4 * PACKED_TOKEN_COST])


@pytest.mark.parametrize("resp, pad_free", [([[3, 3], [3, 3]], True), ([[1, 7], [2, 5]], False)])
def test_step_time_padded_against_packed(resp, pad_free):
    """One iteration, one optimizer step: step time = train_per_token x slots (padded) or
    x PACKED_TOKEN_COST x tokens (packed); with no pad at all packing costs more, with pads less
    whenever the pad share exceeds 1 - 1 / PACKED_TOKEN_COST."""
    jobs = _jobs(resp)
    times, mbts = {}, {}
    for mode in ("padded", "packed"):
        tr = TrainerSpec(train_per_token=0.1, train_per_step=0.0, sync_s=0.0, micro_batch_size=2, micro_batching=mode)
        tl = Engine(jobs, ExecutionSettings(policy="fifo", num_instances=1, max_num_seqs=4, lag_bound=0,
                                            group_size=jobs.group_size),
                    cost=UNIT, kv_capacity=0, trainer=tr, sync_pause=False).run()
        st = tl.frame("step")
        times[mode] = float((st["t_end"] - st["t_start"]).sum())
        mbts[mode] = micro_batch_table(jobs, 2, mode)
        lb_train = lower_bounds(jobs, mbts[mode], 0.1, 0.0, CostModel(decode_a=1e-9, decode_b=0.0, decode_c=0.0,
                                                                        prefill_per_token=0.0), 1, 4, 0, 0, mode)
        assert lb_train[0] == pytest.approx(times[mode])  # decode is free here: the trainer term bounds
    tokens = int(mbts["padded"]["tokens"].sum())
    slots = tokens + int(mbts["padded"]["padded_tokens"].sum())
    assert times["padded"] == pytest.approx(0.1 * slots)
    assert times["packed"] == pytest.approx(0.1 * PACKED_TOKEN_COST * tokens)
    assert (times["packed"] > times["padded"]) == pad_free


@pytest.mark.parametrize("sim_mode, train_mode, want", [
    ("auto", "auto", "packed"), ("auto", "packed", "packed"), ("auto", "sorted", "sorted"),
    ("auto", "padded", "padded"), ("padded", "auto", "padded"), ("sorted", "packed", "sorted")])
def test_sim_follows_the_runs_micro_batching(sim_mode, train_mode, want):
    from asp_ascend.sim.trainer import resolve_micro_batching

    assert resolve_micro_batching(sim_mode, train_mode) == want


def test_default_config_simulates_packed_like_the_run():
    """sim.micro_batching defaults to auto and train.micro_batching to auto (packed where the run
    packs): the simulated run has no padding; pinning both to padded brings the padding back."""
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config
    from asp_ascend.sim.run import simulate_system

    small = ["workload.type=synthetic", "workload.num_prompts=32", "workload.epochs=1", "train.group_size=4",
             "train.global_batch_size=8", "train.mini_batch_size=4", "train.micro_batch_size=4",
             "sim.total_devices=4", "sim.rollout_devices=2", "sim.infer_tp=1", "sim.epochs=1"]
    cfg = load_config(None, small)
    assert cfg.sim.micro_batching == "auto" and cfg.train.micro_batching == "auto"
    auto = simulate_system(cfg, workload_from_config(cfg), "asp").summary
    padded_cfg = load_config(None, small + ["train.micro_batching=padded"])
    padded = simulate_system(padded_cfg, workload_from_config(padded_cfg), "asp").summary
    assert auto["padding_bubble"] == 0.0
    assert padded["padding_bubble"] > 0.0
