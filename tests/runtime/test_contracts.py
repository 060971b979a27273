"""Every implementation of a runtime contract (pipeline/contracts.py) has the calls the loop makes,
and the FSDP trainer group answers them the way one trainer actor does."""
import pytest

from asp_ascend.integrations.mindspeed_rl.sample_source import DispatcherSource
from asp_ascend.pipeline import contracts
from asp_ascend.pipeline.weight_sync import WeightSync

torch = pytest.importorskip("torch")


def members(proto) -> set[str]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n, v in vars(proto).items() if not n.startswith("_") and callable(v) or isinstance(v, property)}
    return names


def test_implementations_have_every_call_of_their_contract():
    from asp_ascend.engines.fsdp_trainer import TrainerGroup
    from asp_ascend.engines.rollout import RolloutEngine
    from asp_ascend.engines.trainer import TrainerEngine

    want = {contracts.Trainer: [TrainerEngine, TrainerGroup], contracts.RolloutInstance: [RolloutEngine],
            contracts.WeightTransport: [WeightSync], contracts.SampleSource: [DispatcherSource]}
    for proto, impls in want.items():
        assert members(proto), proto
        for cls in impls:
            missing = sorted(n for n in members(proto) if not hasattr(cls, n))
            assert not missing, f"{cls.__name__} lacks {missing} of {proto.__name__}"


class Rank:
    """One rank's actor handle: every method call is recorded, its 'ref' is (rank, name, args)."""

    def __init__(self, r: int, calls: list):
        self.r, self.calls = r, calls

    def __getattr__(self, name):
        rank = self

        class _M:
            @staticmethod
            def remote(*args, **kwargs):
                rank.calls.append((rank.r, name, args))
                return (rank.r, name, args)
        return _M


def test_trainer_group_fans_out_like_one_actor():
    from asp_ascend.engines.fsdp_trainer import TrainerGroup

    calls: list = []
    group = object.__new__(TrainerGroup)       # the rank actors without Ray
    group.world, group.ranks = 3, [Rank(r, calls) for r in range(3)]
    group._pick = type("P", (), {"remote": staticmethod(lambda i, *refs: refs[i])})
    assert isinstance(group, contracts.Trainer)
    assert group.begin_iteration.remote(4, 2) == (0, "begin_iteration", (4, 2))   # rank 0's answer
    assert sorted(c[0] for c in calls) == [0, 1, 2]                                 # after all three ran
    calls.clear()
    assert group.send_weights.remote(5, {}) == (0, "send_weights", (5, {}))
    assert calls == [(0, "send_weights", (5, {}))]                                 # rank 0 alone
    assert TrainerGroup.ready is not TrainerGroup.sft and "ready" not in vars(group)  # declared, not set
