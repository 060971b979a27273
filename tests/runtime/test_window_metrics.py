"""Per-iteration metrics rows cost the same at iteration 1 and iteration 200 (work counted,
not timed), and use the same definitions as the run's summary."""
import pytest

from asp_ascend.metrics import Timeline, summarize
from asp_ascend.pipeline.progress import ROW_BUBBLES, WindowMetrics

R, S, W = 2, 4, 10.0


def window_events(i: int) -> list[tuple[str, dict]]:
    """Iteration i's events in [10 i, 10 i + 10]: instance 1 works longer than instance 0
    (skew), the trainer waits for its mini-batch (sorting), a padded step, then the sync."""
    t = W * i
    ev = [("request", dict(epoch=0, iteration=i, instance=r, prompt_id=f"{i}-{r}-{j}", sample=0,
                           admission_version=i, t_admit=t, t_first_token=t + 0.1, t_finish=t + (2.0 if r == 0 else 6.0),
                           prompt_length=3, response_length=5)) for r in range(R) for j in range(S)]
    ev += [("queue", dict(t=t, op="get", size=0)), ("queue", dict(t=t + 2.0, op="put", size=4)), ("queue", dict(t=t + 6.0, op="put", size=8)),
           ("queue", dict(t=t + 6.0, op="get", size=0)),
           ("step", dict(t_start=t + 6.0, t_end=t + 9.0, iteration=i, mini_batch=0, version=i, samples=[],
                         tokens=60, padded_tokens=20)),
           ("sync", dict(t_start=t + 9.0, t_end=t + W, version=i + 1))]
    return ev


def test_window_rows_take_constant_work_and_match_the_summary_definitions():
    win = WindowMetrics(R, S, 0.0)
    work, rows = [], []
    for i in range(200):
        before = win.processed
        for kind, ev in window_events(i):
            win.add(kind, ev)
        rows.append(win.close(W * (i + 1)))
        work.append(win.processed - before)
    assert set(work) == {len(window_events(0))}          # the same work at iteration 1 and 200
    # every window alike, and each row is the summary of its own window's timeline
    alone = Timeline()
    for kind, ev in window_events(0):
        alone.add(kind, **ev)
    want = summarize(alone, num_instances=R, max_num_seqs=S, lag_bound=1)
    for row in (rows[0], rows[1], rows[-1]):
        assert row == pytest.approx({k: want[k] for k in ROW_BUBBLES})
    assert rows[0]["skew_bubble"] > 0 and rows[0]["sorting_bubble"] > 0 and rows[0]["padding_bubble"] == 0.25


def test_window_carries_what_reaches_past_the_sync():
    """A request still running at a sync end belongs to both windows it overlaps."""
    win = WindowMetrics(R, S, 0.0)
    long = dict(epoch=0, iteration=0, instance=0, prompt_id="p", sample=0, admission_version=0, t_admit=0.0,
                t_first_token=0.1, t_finish=15.0, prompt_length=3, response_length=5)
    win.add("request", long)
    win.add("sync", dict(t_start=9.0, t_end=10.0, version=1))
    first = win.close(10.0)
    assert win.events["request"] == [long] and win.events["sync"] == []
    win.add("sync", dict(t_start=19.0, t_end=20.0, version=2))
    second = win.close(20.0)
    assert first["sorting_bubble"] == pytest.approx(0.9)    # generating for 9 of 10 s, trainer idle
    assert second["sorting_bubble"] == pytest.approx(0.5)   # the carried request: 10-15 s
