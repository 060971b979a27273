"""A loss, gradient or reward that turns NaN/inf stops the run naming the iteration; the bad
step is never applied and non-finite weights are never checkpointed."""
import math

import pytest

from asp_ascend.errors import TrainingDiverged
from asp_ascend.pipeline.progress import check_rewards_finite, check_step_finite


@pytest.mark.parametrize("loss,gn", [(float("nan"), 1.0), (1.0, float("inf")), (float("nan"), float("nan"))])
def test_driver_stops_on_a_non_finite_step(loss, gn):
    with pytest.raises(TrainingDiverged, match=r"iteration 5 \(policy version 5\), mini-batch 1: .*nan|inf"):
        check_step_finite({"loss": loss, "grad_norm": gn}, 5, 1)
    check_step_finite({"loss": 0.5, "grad_norm": 2.0}, 5, 1)


def test_driver_stops_on_a_non_finite_reward():
    with pytest.raises(TrainingDiverged, match=r"iteration 2: the reward function \(score\) returned nan .*'p7'"):
        check_rewards_finite([1.0, float("nan")], "p7", 2, "score")
    check_rewards_finite([0.0, 1.0], "p7", 2, "score")


@pytest.fixture
def trainer(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.tiny_model import build_tiny_model, task_vocabulary
    from asp_ascend.engines.trainer import TrainerEngine

    model_dir = build_tiny_model(task_vocabulary(["count 1 to 3 :", "1 2 3"]), tmp_path / "m", hidden_size=32,
                                 num_layers=1, num_heads=2, num_kv_heads=1, max_positions=64, seed=0)
    tr = TrainerEngine(str(model_dir), lr=1e-2, weight_decay=0.0, loss=LossConfig(), micro_batch_size=8,
                       temperature=1.0, seed=0)
    ids = tr.tokenizer("count 1 to 3 :", add_special_tokens=False).input_ids
    resp = tr.tokenizer("1 2 3", add_special_tokens=False).input_ids
    tr.sample = lambda adv: {"prompt_ids": ids, "response_ids": resp, "behav_logprobs": [-1.0] * len(resp),
                             "advantage": adv}
    return tr


@pytest.mark.runtime
def test_trainer_skips_a_non_finite_step_and_keeps_its_weights(trainer):
    import torch

    before = {n: t.clone() for n, t in trainer.model.state_dict().items()}
    trainer.begin_iteration(0, 1)
    st = trainer.train_step([trainer.sample(float("nan"))])
    assert math.isnan(st["grad_norm"]) or math.isnan(st["loss"])
    with pytest.raises(TrainingDiverged):
        check_step_finite(st, 0, 0)
    for n, t in trainer.model.state_dict().items():
        assert torch.equal(t, before[n]), n  # the step was not applied
    st = trainer.train_step([trainer.sample(1.0)])  # a good step afterwards still trains
    assert math.isfinite(st["loss"]) and math.isfinite(st["grad_norm"])
    assert any(not torch.equal(t, before[n]) for n, t in trainer.model.state_dict().items())


@pytest.mark.runtime
def test_non_finite_weights_are_never_checkpointed(trainer, tmp_path):
    import torch

    from asp_ascend.pipeline import checkpoint as ck

    with torch.no_grad():
        next(iter(trainer.model.parameters()))[0].fill_(float("nan"))
    root = tmp_path / "checkpoints"
    with pytest.raises(FloatingPointError, match="non-finite values"):
        ck.save(root, 1, lambda tmp: trainer.save_checkpoint(str(tmp), {"iteration": 1}), ck.run_state([], 1, 4))
    assert ck.find_latest(root) is None
