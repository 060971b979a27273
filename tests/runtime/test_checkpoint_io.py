"""The trainer checkpoint layout (engines/checkpoint_io.py) shared by the one-actor trainer and the
FSDP ranks; the full save/resume round trips are in test_correctness.py and test_fsdp_trainer.py."""
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from asp_ascend.engines import checkpoint_io  # noqa: E402

pytestmark = pytest.mark.runtime


def test_optimizer_state_keys_round_trip():
    """FSDP's name-keyed full optimizer state is stored keyed by index, as a single trainer's."""
    names = ["w", "b"]
    by_name = {"state": {"b": {"step": 1}, "w": {"step": 2}}, "param_groups": [{"lr": 0.1, "params": ["w", "b"]}]}
    by_index = checkpoint_io.indexed_optimizer_state(by_name, names)
    assert by_index == {"state": {1: {"step": 1}, 0: {"step": 2}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
    assert checkpoint_io.named_optimizer_state(by_index, names) == by_name


def test_rng_restored_from_a_checkpoint(tmp_path):
    torch.save(checkpoint_io.rng_state(), tmp_path / checkpoint_io.RNG_FILE)
    want = (torch.rand(3), np.random.rand(), random.random())
    checkpoint_io.restore_rng(tmp_path)
    got = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(want[0], got[0]) and want[1:] == got[1:]
    checkpoint_io.restore_rng(tmp_path / "absent")   # no rng.pt: left as it is


def test_non_finite_weights_are_never_written(tmp_path):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="weight"):
        checkpoint_io.write_checkpoint(str(tmp_path / "ck"), model, None, {}, {"version": 1})
    assert not any(tmp_path.iterdir())


def test_missing_reference_names_the_way_on(tmp_path):
    with pytest.raises(RuntimeError, match="train.kl_coef=0.1 needs it.*resume with train.kl_coef=0"):
        checkpoint_io.reference_file(tmp_path, 0.1)
