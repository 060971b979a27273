"""TrainOnlyShardingManager: the train/forward switches MindSpeed-RL's MegatronShardingManager makes for the
same offload flags (megatron_sharding_manager.py, enter/exit_train_mode and enter/exit_forward_mode), and no
inference mode on a trainer without an engine."""
from __future__ import annotations

import itertools

import pytest

from asp_ascend.integrations.mindspeed_rl.train_only import TrainOnlyShardingManager


class Recorder:
    """A MegatronOffLoader that records its calls and where the state is."""

    def __init__(self):
        self.calls, self.on_device = [], {"param": True, "optimizer": True, "grad": True}

    def __getattr__(self, name):
        if not name.startswith(("onload_", "offload_")):
            raise AttributeError(name)
        what = name.split("_", 1)[1]

        def call():
            self.calls.append(name)
            self.on_device[what] = name.startswith("onload_")
        return call


def mindspeed_calls(opt, grad, param, share, phase):
    """MindSpeed-RL's switches, transcribed: which offloader calls a phase makes."""
    moves = param and not share
    return {"enter_forward_mode": ["onload_param"] if moves else [],
            "exit_forward_mode": ["offload_param"] if moves else [],
            "enter_train_mode": (["onload_param"] if moves else []) + (["onload_optimizer"] if opt else [])
            + (["onload_grad"] if grad else []),
            "exit_train_mode": (["offload_optimizer"] if opt else []) + (["offload_grad"] if grad else [])}[phase]


@pytest.mark.parametrize("opt,grad,param,share", list(itertools.product([False, True], repeat=4)))
def test_switches_match_mindspeed_rl(opt, grad, param, share):
    for phase in ("enter_forward_mode", "exit_forward_mode", "enter_train_mode", "exit_train_mode"):
        rec = Recorder()
        getattr(TrainOnlyShardingManager(rec, opt, grad, param, share), phase)()
        assert rec.calls == mindspeed_calls(opt, grad, param, share, phase), phase


def test_update_leaves_state_where_training_needs_it():
    rec = Recorder()
    sm = TrainOnlyShardingManager(rec, True, True, True, False)
    sm.exit_train_mode()
    sm.exit_forward_mode()           # as after MindSpeed-RL's initialize with every offload flag on
    sm.enter_train_mode()
    assert all(rec.on_device.values())
    sm.exit_train_mode()
    assert not rec.on_device["optimizer"] and not rec.on_device["grad"]


def test_no_flags_no_moves_and_no_inference():
    rec = Recorder()
    sm = TrainOnlyShardingManager(rec)
    for phase in ("enter_forward_mode", "exit_forward_mode", "enter_train_mode", "exit_train_mode"):
        getattr(sm, phase)()
    assert rec.calls == []
    with pytest.raises(RuntimeError, match="no colocated vLLM engine"):
        sm.enter_infer_mode()
    with pytest.raises(RuntimeError, match="no colocated vLLM engine"):
        sm.exit_infer_mode()
