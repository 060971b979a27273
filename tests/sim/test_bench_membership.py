"""benchmarks/bench_membership.py: its options, and the cells it counts as planned alike."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_membership  # noqa: E402


def test_lists_are_checked(capsys):
    with pytest.raises(SystemExit):
        bench_membership.parse(["--lists", "sweep", "combox"])
    assert "--lists: combox is not sweep, more or comboS" in capsys.readouterr().err
    assert bench_membership.parse(["--lists", "more", "combo3"]).lists == ["more", "combo3"]


def test_one_history_epoch_plans_auto_as_stratified():
    """With one epoch of history the predictions' quality is unknown: auto keeps the stratified plan."""
    assert bench_membership.memberships_differ("bimodal", None, 512, 32, {}, [0, 1]) == [False, False]


def test_cells_name_their_list():
    got = bench_membership.cells("bimodal", None, 512, 32, ["more", "combo0"])
    assert {c[0] for c in got} == {"more", "combo0"}
    assert sum(c[0] == "combo0" for c in got) == bench_membership.COMBOS
