"""The synthetic workload's tail knobs where the mix leaves them unread (config/explicit.py): the
tail's shape with a tail wholly above the generation cap (the defaults: tail_scale 1500 > 1024) or
with no tail at all, the body's with no body. Each refusal is checked against the generator itself:
the key changed alone leaves the workload bit for bit the same."""
import copy

import numpy as np
import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError
from asp_ascend.lengths.workloads import workload_from_config

SYN = ["workload.type=synthetic", "workload.num_prompts=512", "train.group_size=4"]


def _same(cfg, key: str, value) -> bool:
    other = copy.deepcopy(cfg)
    setattr(other.workload, key, value)
    a, b = workload_from_config(cfg), workload_from_config(other)
    return np.array_equal(a.mean_length, b.mean_length) and np.array_equal(a.samples(0), b.samples(0))


def test_the_default_tail_is_clipped_at_the_default_cap_so_its_shape_does_nothing():
    cfg = load_config(None, SYN)
    assert cfg.workload.tail_scale > cfg.lengths.max_response_length        # 1500 > 1024
    assert _same(cfg, "tail_alpha", 0.8) and _same(cfg, "tail_alpha", 3.0)
    w = workload_from_config(cfg)
    assert (w.mean_length[0] == 1024).mean() >= cfg.workload.tail_fraction  # the tail: a point mass at the cap
    live = load_config(None, SYN + ["lengths.max_response_length=4096"])    # a cap above the tail's scale
    assert not _same(live, "tail_alpha", 3.0)


def test_the_tail_shape_is_refused_where_the_tail_is_clipped_whole():
    with pytest.raises(ConfigError) as ei:
        load_config(None, SYN + ["workload.tail_alpha=1.2"])
    assert ei.value.problems == [
        "workload.tail_alpha: 1.2 has no effect: every tail length (workload.tail_scale=1500 tokens and up) is at or "
        "above lengths.max_response_length=1024 and clipped to it, whatever the tail's shape; set "
        "workload.tail_scale below 1024 or raise lengths.max_response_length, or remove workload.tail_alpha"]
    load_config(None, SYN + ["workload.tail_alpha=1.2", "lengths.max_response_length=4096"])
    load_config(None, SYN + ["workload.tail_alpha=1.2", "workload.tail_scale=900"])
    with pytest.raises(ConfigError, match=r"workload.tail_alpha: 1.2 has no effect: every tail length "
                                          r"\(workload.tail_scale=2000 tokens"):
        load_config(None, SYN + ["workload.tail_alpha=1.2", "workload.tail_scale=2000",
                                 "lengths.max_response_length=2000"])


@pytest.mark.parametrize("fraction,dead,live", [(0.0, ("tail_alpha", "tail_scale"), ("body_median", "body_sigma")),
                                                (1.0, ("body_median", "body_sigma"), ("tail_alpha", "tail_scale"))])
def test_without_a_tail_or_a_body_its_keys_are_refused(fraction, dead, live):
    cap = ["lengths.max_response_length=16384", f"workload.tail_fraction={fraction}"]
    cfg = load_config(None, SYN + cap)
    for key in dead:
        assert _same(cfg, key, getattr(cfg.workload, key) * 0.5 + 0.37), key
        with pytest.raises(ConfigError, match=rf"workload.{key}: .* has no effect: workload.tail_fraction is "
                                              rf"{fraction:g} .*; set workload.tail_fraction (above 0|below 1)"):
            load_config(None, SYN + cap + [f"workload.{key}=2.5"])
    for key in live:
        assert not _same(cfg, key, getattr(cfg.workload, key) * 0.5 + 0.37), key
        load_config(None, SYN + cap + [f"workload.{key}=2.5"])


def test_the_clipped_default_tail_is_said_when_the_workload_is_built(caplog):
    workload_from_config(load_config(None, SYN))
    assert ("the synthetic tail (workload.tail_scale=1500 tokens and up) lies at or above "
            "lengths.max_response_length=1024: its 10% of prompts are clipped to exactly 1024 tokens and "
            "workload.tail_alpha has no effect") in caplog.text
    caplog.clear()
    workload_from_config(load_config(None, SYN + ["lengths.max_response_length=4096"]))
    assert "synthetic tail" not in caplog.text


def test_the_workload_lengths_benchmark_shows_the_inert_knob():
    """benchmarks/workload_lengths.py (the figures of docs/simulator.md): at the default cap the three
    tail shapes print the same lengths, at a cap above the tail's scale they differ."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import workload_lengths

    base = ["workload.type=synthetic", "workload.num_prompts=2000"]
    clipped = workload_lengths.rows(base, "workload.tail_alpha=0.8,1.5,3.0")
    assert [r.split()[-1] for r in clipped] == ["first", "same", "same"]
    assert all("means at cap  2" in r for r in clipped)     # the tail and the body above 1024: 20-29 %
    live = workload_lengths.rows(base + ["lengths.max_response_length=4096"], "workload.tail_alpha=0.8,1.5,3.0")
    assert [r.split()[-1] for r in live] == ["first", "differs", "differs"]
