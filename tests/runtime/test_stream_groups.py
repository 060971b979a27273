"""``pipeline.stream_groups`` in the trainer: ``accumulate`` over parts of a mini-batch, then
``apply_step(denom)``, is the update ``train_step`` makes on the whole mini-batch (the loop side,
on real Ray actors: tests/runtime/test_execution_streaming.py ``test_stream_groups*``)."""
import random

import pytest

pytestmark = pytest.mark.runtime


def _samples(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        r = [rng.randrange(3, 19) for _ in range(2 + 3 * k)]  # very different lengths
        out.append({"prompt_ids": [rng.randrange(3, 19) for _ in range(3)], "response_ids": r,
                    "behav_logprobs": [-2.8 + 0.05 * j for j in range(len(r))], "advantage": 0.3 * (-1) ** k,
                    "version_first": 0, "version_last": 0, "masked": k == 5})
    return out


def _engine(tiny, agg: str, off_policy: str, lr: float = 1e-2):
    from asp_ascend.algos.grpo import LossConfig
    from asp_ascend.engines.trainer import TrainerEngine

    return TrainerEngine(str(tiny), lr=lr, weight_decay=0.0, loss=LossConfig(off_policy=off_policy, loss_agg=agg),
                         micro_batch_size=2, temperature=1.0, seed=0, micro_batching="sorted")


@pytest.mark.parametrize("agg,off_policy", [("token-mean-step", "decoupled_ppo"), ("seq-mean", "tis"),
                                            ("token-mean-iteration", "none")])
def test_streamed_steps_equal_whole_steps(tiny, agg, off_policy):
    """Two iterations of two mini-batches each: one trainer steps on whole mini-batches, the other
    streams each mini-batch in three parts (one, two, then the rest). The weights after every step,
    the loss and the token counts agree; the second mini-batch of an iteration uses pi_prox (the
    iteration's start weights) on both sides. A wrong scale, a gradient zeroed between parts, a step
    per part, or pi_prox taken from the moved weights would each break it."""
    import torch

    from asp_ascend.scheduler.microbatch import step_denominator

    whole, streamed = _engine(tiny, agg, off_policy), _engine(tiny, agg, off_policy)
    for it in range(2):
        for tr in (whole, streamed):
            tr.begin_iteration(it, 2)
        for m in range(2):
            mb = _samples(8, seed=10 * it + m)
            for s in mb:
                s["version_first"] = s["version_last"] = it
            denom = 37.5 if agg == "token-mean-iteration" else step_denominator(mb, agg)
            a = whole.train_step(mb, denom)
            parts = [streamed.accumulate(p) for p in (mb[:1], mb[1:3], mb[3:])]
            b = streamed.apply_step(denom)
            assert [p["samples"] for p in parts] == [1, 2, 5]
            assert sum(p["tokens"] for p in parts) == b["tokens"] == a["tokens"]
            assert b["parts"] == 3 and b["t_first"] <= parts[0]["t_start"] + 1e-6
            # the record counts the seconds the trainer was busy on the step, not the gaps between parts
            assert b["t_end"] - b["t_start"] <= b["t_end"] - b["t_first"] + 1e-6
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
            for p, q in zip(whole.model.parameters(), streamed.model.parameters()):
                # the step's (clipped) gradients agree to float rounding; the weights to far below
                # one AdamW step (lr 1e-2: AdamW's sign-like first steps amplify rounding to ~1e-5)
                assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7)
                assert float((p - q).abs().max()) < 1e-4
    moved = any(not torch.allclose(p, q) for p, q in zip(_engine(tiny, agg, off_policy).model.parameters(),
                                                           whole.model.parameters()))
    assert moved  # the steps did change the weights (the comparison above is not vacuous)


def test_accumulation_guards(tiny):
    """No step without parts, no whole step or checkpoint over open parts, no iteration started over
    them; a part that fails drops the whole open step (no half gradient reaches an optimizer step)."""
    tr = _engine(tiny, "token-mean-step", "none")
    tr.begin_iteration(0, 1)
    with pytest.raises(RuntimeError, match="no accumulation is open"):
        tr.apply_step(10.0)
    tr.accumulate(_samples(2, 0))
    with pytest.raises(RuntimeError, match="is open"):
        tr.train_step(_samples(2, 1))
    with pytest.raises(RuntimeError, match="still open"):
        tr.begin_iteration(1, 1)
    with pytest.raises(RuntimeError, match="is open"):
        tr.save_checkpoint("unused", {})
    bad = _samples(1, 2)
    bad[0]["behav_logprobs"] = None   # the part fails inside its forward/backward
    with pytest.raises(Exception):
        tr.accumulate(bad)
    with pytest.raises(RuntimeError, match="no accumulation is open"):
        tr.apply_step(10.0)
    assert all(p.grad is None for p in tr.model.parameters())


@pytest.mark.parametrize("rule,expect", [
    ("fewest_left", 1),        # mini-batch 1: 1 left of 4; mini-batch 0: 3 left
    ("half_generated", 1),
    ("lowest_index", 0),
])
def test_stream_candidate_rules(rule, expect):
    from asp_ascend.scheduler.execution import stream_candidate

    size = {0: 4, 1: 4, 2: 4}
    got = {0: 1, 1: 3, 2: 0}
    assert stream_candidate(rule, [0, 1, 2], size.get, got.get) == expect
    # half generated: a mini-batch with a quarter generated may not start, with half it may
    assert stream_candidate("half_generated", [0, 2], size.get, got.get) is None
    assert stream_candidate("half_generated", [0, 2], size.get, {0: 2, 2: 0}.get) == 0
    assert stream_candidate("fewest_left", [0, 2], size.get, got.get) == 0
    assert stream_candidate("lowest_index", [2, 0], size.get, got.get) is None   # 2 has nothing generated
    with pytest.raises(ValueError, match="stream_groups_start"):
        stream_candidate("eager", [0], size.get, got.get)


def test_report_counts_streamed_steps():
    """``asp report``'s tail table names the streamed steps (``parts`` > 1), their parts and the
    trainer's waits between parts (span from the first part less busy time); a run without any
    decision or streamed step gets no table."""
    from asp_ascend.metrics import Timeline
    from asp_ascend.report.run import tail_decisions

    tl = Timeline()
    tl.add("step", t_start=1.0, t_end=2.0, iteration=0, mini_batch=0, tokens=10, padded_tokens=0)
    assert tail_decisions(tl) == []
    tl.add("step", t_start=5.0, t_end=6.0, iteration=1, mini_batch=0, tokens=10, padded_tokens=0,
           t_first=4.0, parts=3)
    tl.add("step", t_start=9.0, t_end=9.5, iteration=2, mini_batch=0, tokens=10, padded_tokens=0,
           t_first=8.5, parts=2)
    md = "\n".join(tail_decisions(tl))
    assert "| streamed optimizer steps (of 3; 2.5 parts each, the trainer waited 0.75 s between parts per step) | 2 |" in md
