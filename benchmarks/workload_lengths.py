"""The length distribution of a workload as `asp schedule` and `asp simulate` build it, for the
config's defaults or any overrides: per-prompt mean lengths and per-sample lengths of epoch 0.

    python benchmarks/workload_lengths.py workload.type=synthetic            # the default synthetic workload
    python benchmarks/workload_lengths.py workload.type=synthetic lengths.max_response_length=4096 \\
        --vary workload.tail_alpha=0.8,1.5,3.0                                # one row per value

Prints, per row: the share of prompts whose mean is at the generation cap, the means' p50/p90/p99,
the samples' p50/p99/mean and share at the cap, and whether the samples equal the first row's
(bit for bit): a key whose later values all print "same" has no effect on the workload
(docs/simulator.md, "Keys a mode ignores").
"""
from __future__ import annotations

import argparse

import numpy as np


def rows(overrides: list[str], vary: str | None) -> list[str]:
    from asp_ascend.config import load_config
    from asp_ascend.lengths.workloads import workload_from_config

    key, _, values = (vary or "").partition("=")
    variants = [[f"{key}={v}"] for v in values.split(",")] if vary else [[]]
    out, first = [], None
    for extra in variants:
        cfg = load_config(None, overrides + extra, check_files=False, saved=True)   # an inert key measured, not refused
        w = workload_from_config(cfg)
        M = cfg.lengths.max_response_length
        m, s = w.mean_length[0], w.samples(0)
        same = "first" if first is None else ("same" if np.array_equal(s, first) else "differs")
        first = s if first is None else first
        out.append(f"{' '.join(extra) or '(as configured)':28s} means at cap {(m >= M).mean():6.1%}  means p50/p90/p99 "
                   f"{np.percentile(m, 50):6.0f} {np.percentile(m, 90):6.0f} {np.percentile(m, 99):6.0f}  samples "
                   f"p50/p99/mean {np.percentile(s, 50):6.0f} {np.percentile(s, 99):6.0f} {s.mean():7.1f}  at cap "
                   f"{(s >= M).mean():6.1%}  {same}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    ap.add_argument("--vary", help="KEY=V1,V2,...: one row per value")
    a = ap.parse_args()
    print("\n".join(rows(a.overrides, a.vary)))
