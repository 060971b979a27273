"""Behaviour pinned: the default config's schedules, for the same seed, are exactly what they were
before the redesign of the glue between a schedule and its executors (issue 13; the digests below
were produced by commit cd67c1e and reproduced after it).

A refactor must leave them alone. A change of behaviour on purpose (a planner rule) updates the
digests here and its commit says what changed and why: ``python tests/core/test_behaviour_pinned.py``
prints the current ones. The simulator's figures are pinned in ``tests/sim/test_sim_pinned.py``
(which also reproduces on cd67c1e); the runtime's trained sequence needs vLLM and minutes, so it
was compared by hand (docs/architecture.md, "Behaviour kept").
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from asp_ascend.config import load_config
from asp_ascend.scheduler.run import build_schedule

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["epoch", "prompt_id", "iteration", "mini_batch", "instance", "dispatch_rank"]

# configs/cpu_tiny_grpo.yaml with train.epochs=2 rollout.num_instances=2 rollout.tail_concurrency=off (the
# default): sha256 of the schedule's columns. asp's changed on purpose after cd67c1e: the iteration
# whose longest group is the shortest goes first (it fills the pipeline; planner._lightest_floor_first)
# asp's and balanced's changed on purpose again when planner._desc_order became a stable sort: equal
# predicted lengths (or works) now keep the seeded shuffle's order on every numpy and CPU; asp's (and
# asp+tail_auto's) again when the run's first window became iteration 0's alone (scheduler.fill_first:
# no later group is ranked ahead of iteration 0's in the pipeline fill); both again when only the groups
# whose latency exceeds the k + 1 periods of iteration order are pulled forward (scheduler.pull_forward:
# needed; with rounded, the rule before it, both give their previous digests, 3f5037a50d1934b6 and 61e30f3d67019123)
SCHEDULES = {"asp": "fdf78cc36cbe4bb4", "fifo": "8a9e5245dc58eac6", "random": "df7217608fbd1938",
             "sorted": "0b8448e53cd0fe18", "balanced": "6859679227fb9895",
             # rollout.tail_concurrency=auto (opt-in): asp places and orders the groups that set their
             # iteration's floor differently (tail rooms, DESIGN 9 c; pinned when that landed, not at cd67c1e,
             # as 62886c2d529a2aac). Since the rooms are priced at the sequences an instance runs
             # (TailModel.batch) no cap pays on this config, and auto plans exactly as off: asp's digest
             "asp+tail_auto": "fdf78cc36cbe4bb4"}


def schedule_digest(name: str) -> str:
    policy, _, tail = name.partition("+tail_")
    cfg = load_config(ROOT / "configs/cpu_tiny_grpo.yaml",
                      [f"scheduler.policy={policy}", "train.epochs=2", "rollout.num_instances=2",
                       f"rollout.tail_concurrency={tail or 'off'}"])
    sched, _ = build_schedule(cfg, compare=False)
    return hashlib.sha256(sched[COLUMNS].astype(str).to_csv(index=False).encode()).hexdigest()[:16]


@pytest.mark.parametrize("policy", sorted(SCHEDULES))
def test_default_config_schedules_unchanged(policy):
    assert schedule_digest(policy) == SCHEDULES[policy], (
        f"the {policy} schedule of configs/cpu_tiny_grpo.yaml changed; if on purpose, update SCHEDULES "
        "(python tests/core/test_behaviour_pinned.py) and say why in the commit")


if __name__ == "__main__":
    print(json.dumps({p: schedule_digest(p) for p in SCHEDULES}, indent=1))
