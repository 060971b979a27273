"""`asp train` leaves nothing behind: every shared-memory segment and semaphore the run's
processes open in /dev/shm (vLLM's engine-core queues, multiprocessing's semaphores) is gone
when it returns. Segments are attributed to the run by watching its own process tree, so other
jobs on the machine do not count."""
import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_common import CONFIG, SMALL, stack_missing  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.slow,
              pytest.mark.skipif(stack_missing() is not None, reason=str(stack_missing())),
              pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")]


class ShmWatch:
    """The /dev/shm files that this process's descendants map or hold open, polled while a run goes."""

    def __init__(self):
        import psutil

        self.me, self.seen, self._stop = psutil.Process(), set(), threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            for p in self.me.children(recursive=True):
                for src in (f"/proc/{p.pid}/maps",):
                    try:
                        with open(src) as fh:
                            self.seen.update(line.split("/dev/shm/")[1].split()[0] for line in fh if "/dev/shm/" in line)
                    except OSError:
                        pass
                try:
                    for fd in os.listdir(f"/proc/{p.pid}/fd"):
                        t = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                        if t.startswith("/dev/shm/"):
                            self.seen.add(t[len("/dev/shm/"):].split()[0])
                except OSError:
                    pass
            self._stop.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


def test_train_leaves_no_shared_memory_behind(tmp_path):
    from asp_ascend.config import load_config
    from asp_ascend.pipeline.run import run_train

    cfg = load_config(CONFIG, SMALL + ["rollout.num_instances=1", "rollout.num_cpus=1", "train.num_cpus=1",
                                       "train.max_iterations=2", "train.warmup_sft_steps=0", "train.eval_every=0",
                                       f"output_dir={tmp_path}"])
    with ShmWatch() as watch:
        assert run_train(cfg) == 0
    assert any(n.startswith("psm_") for n in watch.seen), watch.seen  # the watch saw vLLM's queues
    deadline = time.time() + 10
    while time.time() < deadline and any((Path("/dev/shm") / n).exists() for n in watch.seen):
        time.sleep(0.5)
    left = sorted(n for n in watch.seen if (Path("/dev/shm") / n).exists())
    assert not left, f"left in /dev/shm: {left}"
