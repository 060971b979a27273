"""Speculative decoding as a cost model (scheduler/speculative.py)."""
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.scheduler.cost import CostModel
from asp_ascend.scheduler.speculative import Speculation, from_config

CM = CostModel(decode_a=1.0, decode_b=0.0, decode_c=0.01)


def test_tokens_per_step_and_coefficients_by_hand():
    s = Speculation(0.5, 4, draft_s=0.5, draft_per_seq=0.02)
    assert s.tokens_per_step == pytest.approx((1 - 0.5 ** 5) / 0.5)      # 1.9375
    a, b, c = s.coefficients(CostModel(decode_a=1.0, decode_b=2.0, decode_c=0.01))
    assert (a, b, c) == (pytest.approx(1.5 / 1.9375), pytest.approx(2.0 / 1.9375),
                         pytest.approx((0.05 + 0.02) / 1.9375))


def test_pays_at_small_batch_costs_at_large_batch():
    """gamma = 1, alpha = 0.5: 1.5 tokens per step. Plain: 1 + 0.01 n per token; speculating:
    (1 + 0.02 n) / 1.5. Equal at n = 100: it pays below, costs above."""
    s = Speculation(0.5, 1)
    assert s.pays(CM, 1, 0) and s.pays(CM, 99, 0)
    assert not s.pays(CM, 100, 0) and not s.pays(CM, 500, 0)
    assert s.break_even_batch(CM, 0.0) == 99
    assert Speculation(0.0, 1).break_even_batch(CM, 0.0) == 0   # nothing accepted: never pays


def test_from_config(empty_yaml):
    cfg = load_config(empty_yaml, ["rollout.speculative=ngram", "rollout.num_speculative_tokens=1",
                                   "cost.spec_acceptance=0.5", "cost.spec_draft_s=0", "cost.spec_draft_per_seq=0"])
    assert from_config(cfg.rollout, cfg.cost, CM, 0.0).max_batch == 99           # auto: break-even
    cfg.rollout.speculative_max_batch = "always"
    assert from_config(cfg.rollout, cfg.cost, CM, 0.0).max_batch == 0            # never off (vLLM's default)
    cfg.rollout.speculative_max_batch = "32"
    s = from_config(cfg.rollout, cfg.cost, CM, 0.0)
    assert s.on(32) and not s.on(33)
    cfg.rollout.speculative = "none"
    assert from_config(cfg.rollout, cfg.cost, CM, 0.0) is None
    cfg.rollout.speculative, cfg.cost.spec_acceptance = "ngram", 0.0
    cfg.rollout.speculative_max_batch = "auto"
    assert from_config(cfg.rollout, cfg.cost, CM, 0.0) is None                   # never pays: off


@pytest.mark.parametrize("over", ["cost.spec_acceptance=1.0", "rollout.speculative_max_batch=-3",
                                  "rollout.speculative=medusa2"])
def test_bad_keys_are_named(over, empty_yaml):
    with pytest.raises(ConfigError, match=over.split("=")[0]):
        load_config(empty_yaml, [over])
