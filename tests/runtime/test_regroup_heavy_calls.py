"""pipeline.regroup_heavy on the runtime's trainer side (pipeline/train_calls.py), without Ray: the
mini-batch the loop is about to train takes the heaviest generated groups of its iteration while a
group of it is not generated, weighed by tokens (responses + the prompt, as on_finish reports)."""
from asp_ascend.pipeline.train_calls import TrainerCalls
from asp_ascend.scheduler.execution import ExecutionPlan, ExecutionSettings, jobs_from_columns
from asp_ascend.scheduler.tail_control import TailControl, TailOptions


class _Loop(TrainerCalls):
    """The state _whole_mini_batch reads: the generated, untrained groups and the tail glue."""

    def __init__(self, heavy: bool):
        # one iteration of three mini-batches of two groups (G = 1): (a, b), (c, late), (d, e)
        pids = ["a", "b", "c", "late", "d", "e"]
        jobs = jobs_from_columns([0] * 6, range(6), pids, [0] * 6, [0] * 6, [0, 0, 1, 1, 2, 2])
        plan = ExecutionPlan(ExecutionSettings(group_size=1, max_num_seqs=6), jobs)
        prompt = {"a": 100, "b": 100}
        self.tail = TailControl(plan, TailOptions(regroup=True, regroup_heavy=heavy), max_tokens=1000,
                                event=lambda kind, **kw: self.events.append((kind, kw)), now=lambda: 0.0,
                                prompt_length=lambda pid: prompt.get(pid, 0))
        self.iteration, self.events, self.queue = 0, [], set()
        self.planned = {m: [(0, p) for p in pids[2 * m:2 * m + 2]] for m in range(3)}
        for pid, n in (("a", 10), ("b", 12), ("c", 45), ("d", 20), ("e", 50)):
            self.tail.on_finish((0, pid), [n])
            self.queue.add((0, pid))
        self.queue -= {(0, "a"), (0, "b")}


def test_the_step_takes_the_heaviest_generated_groups():
    for heavy, want in ((False, ([(0, "d"), (0, "e")], [(0, "c"), (0, "late")])),
                        (True, ([(0, "e"), (0, "c")], [(0, "late"), (0, "d")]))):
        loop = _Loop(heavy)
        loop.tail.on_trained(0, 0)              # (a, b) trained: 1 waits for "late", 2 is generated
        mbs, m = loop._whole_mini_batch(loop.planned, loop.tail.members(0, loop.planned), [1, 2])
        assert m == 2 and (mbs[2], mbs[1]) == want, heavy
        assert [e[1].get("rule") for e in loop.events if e[0] == "regroup"] == (["heavy_first"] if heavy else [])
