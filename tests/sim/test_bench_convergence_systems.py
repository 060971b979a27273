"""benchmarks/bench_convergence.py's systems: every one is a valid ``asp train`` configuration of
the CPU default (the overrides a run is given), and the streaming systems are their non-streaming
counterparts with ``pipeline.stream_groups`` on and nothing else changed (so a paired gap between
them is streaming's)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_convergence  # noqa: E402


@pytest.mark.parametrize("name", sorted(bench_convergence.SYSTEMS))
def test_every_system_is_a_valid_config(name):
    from asp_ascend.config import load_config, stream_groups_of

    cfg = load_config(bench_convergence.CONFIG, [*bench_convergence.SYSTEMS[name], "seed=1", "train.eval_every=0"])
    assert cfg.seed == 1
    # pipeline.stream_groups as asp train resolves it (auto: on for asp, pinned off but for *_stream)
    assert stream_groups_of(cfg, cfg.scheduler.policy) == name.endswith("_stream")
    assert (cfg.pipeline.mode == "sync") == (name == "sync")


@pytest.mark.parametrize("stream,base", [("asp_lossless_stream", "asp_lossless"),
                                         ("asp_partial_s1_stream", "asp_partial_s1")])
def test_a_stream_system_is_its_base_with_streaming_on(stream, base):
    systems = bench_convergence.SYSTEMS
    assert systems[stream] == [*systems[base], "pipeline.stream_groups=true"]
    assert stream not in bench_convergence.DEFAULT_SYSTEMS   # the default invocation stays the table's twelve runs
