"""configs/cpu_tiny_heavytail.yaml: the quickstart's task with a heavier answer-length tail
(the heavy-tail workload of benchmarks/bench_packing.py). It loads and validates, schedules,
and its lengths are what the config's comment says: a heavier tail than the quickstart's, so
padded micro-batches waste more of the trainer (the padding bubble packing removes)."""
from pathlib import Path

import numpy as np

from asp_ascend.config import load_config
from asp_ascend.data.datasets import prompts_from_config
from asp_ascend.scheduler.microbatch import plan_step

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _lengths(name: str) -> np.ndarray:
    train, _ = prompts_from_config(load_config(CONFIGS / name))
    return train.known_lengths - 1  # answer words (known lengths count the end-of-sequence token)


def test_heavier_tail_than_the_quickstart():
    quick, heavy = _lengths("cpu_tiny_grpo.yaml"), _lengths("cpu_tiny_heavytail.yaml")
    assert heavy.max() > 5 * quick.max() and np.percentile(heavy, 95) > 3 * np.percentile(quick, 95)
    assert 0.5 < (heavy < 10).mean() < 0.7  # most answers stay short
    assert 20 < heavy.mean() < 26 and (heavy > 100).mean() >= 0.04 and heavy.max() == 281
    cfg = load_config(CONFIGS / "cpu_tiny_heavytail.yaml")
    assert heavy.max() + 1 <= cfg.lengths.max_response_length  # no answer is truncated


def test_padded_micro_batches_waste_more_on_the_heavy_tail():
    def pad_share(name):
        cfg = load_config(CONFIGS / name)
        t = cfg.train
        lens = np.repeat(_lengths(name)[: t.mini_batch_size] + 6, t.group_size)
        plan = plan_step(lens, mode="padded", max_tokens=t.micro_batch_size * int(lens.max()),
                         max_seqs=t.micro_batch_size)
        return plan.padded_tokens / (plan.padded_tokens + plan.tokens)
    assert pad_share("cpu_tiny_heavytail.yaml") > pad_share("cpu_tiny_grpo.yaml") + 0.1


def test_schedules():
    from asp_ascend.scheduler.run import build_schedule

    cfg = load_config(CONFIGS / "cpu_tiny_heavytail.yaml")
    sched, report = build_schedule(cfg, compare=False)
    assert sched["iteration"].nunique() == cfg.train.epochs * 256 // cfg.train.global_batch_size
    # the run packs (train.micro_batching auto): the estimate prices no pad, as the trainer computes none
    assert cfg.train.micro_batching == "auto" and report["predicted"]["padding_bubble"] == 0
    padded = load_config(CONFIGS / "cpu_tiny_heavytail.yaml", ["train.micro_batching=padded"])
    assert build_schedule(padded, compare=False)[1]["predicted"]["padding_bubble"] > 0
