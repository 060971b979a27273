"""benchmarks/bench_slots.py: the slot-time split by cause, hand-computed on the one-instance case of
test_sim_pull_forward (2 slots, k = 1, four iterations of {4, 4, 1} tokens, a 3 s trainer step), and
its table on a small run."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_slots as bs  # noqa: E402
from test_sim_pull_forward import _plan, _simulate  # noqa: E402


def _split(rule):
    req, sync = _simulate(_plan(rule))
    return bs.slot_time(req, sync, num_instances=1, max_num_seqs=2, lag_bound=1), float(req["t_finish"].max())


def test_slot_time_by_hand():
    # needed: 18 s x 2 slots, every one busy (36 slot-seconds of decode)
    st, t = _split("needed")
    assert t == 18.0
    assert st["busy"] == pytest.approx(36.0) and st["lag_blocked"] == st["waiting"] == st["drain"] == 0.0
    # rounded, 21 s x 2 slots = 42: one slot free 13-14 (iteration 2's 1 alone, iteration 3 not admissible
    # before V2 at 16), both 14-16: 5 lag-blocked slot-seconds; one free 20-21 with nothing left to admit:
    # 1 of drain; all before the first publish (V1 at 8) busy
    st, t = _split("rounded")
    assert t == 21.0
    assert st["busy"] == pytest.approx(36.0)
    assert st["lag_blocked"] == pytest.approx(5.0) and st["drain"] == pytest.approx(1.0)
    assert st["waiting"] == 0.0 and st["sync"] == 0.0 and st["fill_lag"] == 0.0
    assert st["lag_by_instance"] == [pytest.approx(5.0)]
    assert sum(st[c] for c in bs.CAUSES) == pytest.approx(2 * t)


def test_table_on_a_small_run(capsys):
    assert bs.main(["--workloads", "bimodal", "--devices", "64", "--prompts", "1024", "--plan-seeds", "0",
                    "--set", "rollout.max_num_seqs=32"]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("| bimodal | 64 |")]
    assert len(lines) == 3
    for line in lines:        # the causes sum to the run time per iteration (the last iteration's drain included)
        cells = [c.strip() for c in line.strip("|").split("|")]
        busy, lag, wait, sync, drain = (float(cells[i].split()[0]) for i in (4, 5, 6, 7, 8))
        assert busy + lag + wait + sync + drain > 0.9 * float(cells[3])
