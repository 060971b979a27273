"""Property tests of the admission/lag state machine: random delays, failures, restarts.

Whatever the order of finishes, instance failures and restarts, every job is generated
to completion exactly once (a failed attempt is re-dispatched, never trained), every
iteration is trained once, and no trained sample's lag exceeds k.
"""
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_ascend.scheduler.admission import AdmissionController, Dispatcher, Job


@st.composite
def scenarios(draw):
    R = draw(st.integers(1, 4))
    k = draw(st.integers(0, 3))
    n_iter = draw(st.integers(1, 5))
    per_iter = draw(st.integers(1, 6))
    shared = draw(st.booleans())
    guided = draw(st.booleans())
    jobs = []
    rank = 0
    for it in range(n_iter):
        for j in range(per_iter):
            pull = draw(st.integers(0, k)) if it > 0 else 0  # ASP-style pull-forward
            jobs.append(Job(it, rank - pull * per_iter * 2, f"p{it}-{j}", instance=draw(st.integers(0, R - 1))))
            rank += 1
    ops = draw(st.lists(st.tuples(st.sampled_from(["finish", "fail", "restart", "train"]),
                                  st.integers(0, 1000)), min_size=1, max_size=200))
    return R, k, n_iter, per_iter, shared, guided, jobs, ops


@settings(max_examples=300, deadline=None, derandomize=True)
@given(scenarios())
def test_nothing_lost_duplicated_or_too_stale(sc):
    R, k, n_iter, per_iter, shared, guided, jobs, ops = sc
    adm = AdmissionController(k, R)
    d = Dispatcher(jobs, R, adm, shared=shared, dispatch="guided" if guided else "static")
    alive = [True] * R
    running: list[tuple[int, Job, int]] = []  # (instance, job, admission version)
    completed: dict[int, list[tuple[str, int]]] = {}
    trained_ids: list[str] = []
    lags: list[int] = []
    trained = 0

    def fill():
        for steal in (False, True):          # own jobs first, then (guided) others' not yet started
            for inst in range(R):
                if alive[inst]:
                    while (nxt := d.next_for(inst, steal)) is not None:
                        running.append((inst, nxt[0], nxt[1]))

    def train_ready():
        nonlocal trained
        while trained < n_iter and len(completed.get(trained, [])) == per_iter:
            for pid, v in completed[trained]:
                trained_ids.append(pid)
                lags.append(trained - v)
            trained += 1
            adm.on_publish(trained)
            for inst in range(R):
                if alive[inst]:
                    adm.on_instance_synced(inst, trained)

    def apply(op, x):
        if op == "finish" and running:
            inst, job, v = running.pop(x % len(running))
            d.on_finish(job.prompt_id, job.epoch)
            completed.setdefault(job.iteration, []).append((job.prompt_id, v))
        elif op == "fail" and sum(alive) > 1:
            inst = x % R
            if alive[inst]:
                alive[inst] = False
                running[:] = [r for r in running if r[0] != inst]  # its work in flight is lost
                d.on_instance_failed(inst)
        elif op == "restart":
            inst = x % R
            if not alive[inst]:
                adm.on_instance_synced(inst, adm.published)  # rejoins with the current weights
                d.on_instance_restarted(inst)
                alive[inst] = True
        elif op == "train":
            train_ready()

    for op, x in ops:
        fill()
        apply(op, x)
    # drain: finish everything in order
    for _ in range(10 * len(jobs) + 10):
        fill()
        if running:
            apply("finish", 0)
        train_ready()
        if trained == n_iter:
            break
    assert trained == n_iter, "the run must always complete"
    assert sorted(trained_ids) == sorted(j.prompt_id for j in jobs)  # exactly once each
    assert max(lags) <= k
    assert d.done and d.pending() == 0
