"""The ASP sampler and batch layout without verl (torchdata's protocol driven by hand)."""
from __future__ import annotations

import pandas as pd
import pytest

from asp_ascend.errors import DataError
from asp_ascend.integrations.verl.layout import mini_batch_layout, update_steps
from asp_ascend.integrations.verl.sampler import AspSampler


def _schedule(epochs=2, n=20, B=8, m=4):
    rows = []
    for e in range(epochs):
        for p in range(n):
            it = p // B
            rows.append({"epoch": e, "prompt_id": str((p * 7 + e) % n), "iteration": e * 10 + it,
                         "mini_batch": (p % B) // m, "instance": p % 2, "dispatch_rank": p % B,
                         "predicted_length": float(p)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_layout_makes_verls_update_steps_the_mini_batches(dp):
    mbs = [list(range(j * 8, j * 8 + 8)) for j in range(3)]
    assert update_steps(mini_batch_layout(mbs, dp), 8, dp) == mbs


def test_sampler_yields_full_iterations_per_epoch_and_drops_the_partial_one():
    s = AspSampler(_schedule(), 8, 20)
    assert len(s) == 16                                  # 2 full iterations of 8; the 4 left over are dropped
    e0, e1 = list(iter(s)), list(iter(s))
    assert len(e0) == len(e1) == 16 and e0 != e1
    sched = _schedule()
    first = sched[(sched.epoch == 0) & (sched.iteration == 0)]
    assert sorted(e0[:8]) == sorted(first.prompt_id.astype(int))


def test_state_resumes_mid_epoch_and_iterators_made_before_a_load_do_not_move_the_epoch():
    ref = AspSampler(_schedule(), 8, 20)
    full = list(iter(ref)) + list(iter(ref))
    s = AspSampler(_schedule(), 8, 20)
    it = iter(s)
    head = [next(it) for _ in range(8)]
    state = s.state_dict()
    t = AspSampler(_schedule(), 8, 20)
    iter(t)                                              # torchdata makes (and drops) iterators while restoring
    t.load_state_dict(state)
    tail = list(iter(t)) + list(iter(t))
    assert head + tail == full


def test_resume_at_an_epoch_boundary_starts_verls_epoch():
    ref = AspSampler(_schedule(), 8, 20)
    list(iter(ref))
    second = list(iter(ref))
    s = AspSampler(_schedule(), 8, 20)
    s.resume_at(global_steps=2, steps_per_epoch=2)       # verl skipped data.pt at the boundary
    assert list(iter(s)) == second


def test_errors_name_the_fix():
    with pytest.raises(DataError, match="train.global_batch_size=4"):
        AspSampler(_schedule(), 4, 20)
    s = AspSampler(_schedule(epochs=1), 8, 20)
    list(iter(s))
    with pytest.raises(DataError, match="trainer.total_epochs"):
        list(iter(s))
    with pytest.raises(DataError, match="outside the dataset"):
        list(iter(AspSampler(_schedule(), 8, 10)))
    t = AspSampler(_schedule(), 8, 20)
    t.load_state_dict({"epoch": 0, "yielded": 8})
    with pytest.raises(DataError, match="another schedule"):
        t.resume_at(global_steps=3, steps_per_epoch=2)
