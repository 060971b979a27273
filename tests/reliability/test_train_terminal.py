"""`asp train` as a user runs it, in its own process with its output piped (not a terminal):

- a run whose loss really turns non-finite (train.lr=1e30 passes validation: it is finite)
  stops with exit status 2 and an error naming the iteration, and writes no checkpoint of the
  diverged policy;
- the terminal holds only asp's own lines: the actors' vLLM/torch warnings, Ray's notices and
  load bars go to output_dir/train.log;
- Ctrl-C (SIGINT to the process group, as a terminal sends it) names the newest checkpoint and
  the resume command, leaves no process of the run behind, and that command resumes the run.
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_common import CONFIG, SMALL, stack_missing  # noqa: E402

pytestmark = [pytest.mark.runtime, pytest.mark.slow,
              pytest.mark.skipif(stack_missing() is not None, reason=str(stack_missing())),
              pytest.mark.skipif(sys.platform != "linux", reason="process groups and /proc: Linux")]

ONE = SMALL + ["rollout.num_instances=1", "rollout.num_cpus=1", "train.num_cpus=1", "train.warmup_sft_steps=0",
               "train.eval_every=0", "logging.progress=true", "logging.tensorboard=false"]
OURS = re.compile(r"^(\[asp train +[0-9.]+s\] |asp train: |  asp train )")


def _cmd(*overrides):
    return [sys.executable, "-m", "asp_ascend.cli", "train", str(CONFIG), *ONE, *overrides]


def _foreign(text: str) -> list[str]:
    """Lines of the terminal output that asp did not write itself."""
    return [line for line in text.splitlines() if line.strip() and not OURS.match(line)]


def test_a_diverging_run_stops_naming_the_iteration_and_the_terminal_stays_readable(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run(_cmd("train.lr=1e30", "train.max_iterations=4", "train.checkpoint_every=1",
                            f"output_dir={out}"), capture_output=True, text=True, timeout=600)
    text = p.stdout + p.stderr
    assert p.returncode == 2, text[-3000:]
    err = re.search(r"asp train: error: iteration \d+ \(policy version (\d+)\), mini-batch \d+: loss nan", p.stderr)
    assert err, p.stderr[-3000:]
    assert "Traceback" not in text
    assert not (out / "summary.json").exists()
    # no checkpoint of the diverged policy: only versions up to the one the failing iteration trained
    # from (an iteration whose rewards are all equal has zero advantages, no update, and may be saved)
    bad = int(err.group(1))
    ckpts = out / "checkpoints"
    saved = sorted(int(c.name[5:]) for c in ckpts.glob("iter_*")) if ckpts.exists() else []
    assert all(v <= bad for v in saved), (saved, bad)
    # the run's own lines only: what the actors and the libraries printed is in train.log
    assert _foreign(text) == [], "\n".join(_foreign(text)[:30])
    log = (out / "train.log").read_text()
    assert "output of actor process" in log  # the actors wrote there (vLLM's start-up lines at least)


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _sigint_default():
    """The run gets SIGINT's default action, as under an interactive shell (a job started in the
    background of a script inherits SIGINT ignored, and Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_names_the_checkpoint_and_the_printed_command_resumes(tmp_path):
    import psutil

    from asp_ascend.pipeline.checkpoint import find_latest

    out = tmp_path / "run"
    p = subprocess.Popen(_cmd("train.max_iterations=8", "train.checkpoint_every=2", f"output_dir={out}"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0,
                         cwd=tmp_path, preexec_fn=_sigint_default)
    try:
        deadline = time.time() + 480
        while find_latest(out / "checkpoints") is None and p.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, "the run ended before its first checkpoint: " + p.communicate()[1][-3000:]
        assert find_latest(out / "checkpoints") is not None, "no checkpoint within 8 minutes"
        procs = _descendants(p.pid)
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C at a terminal does: the whole foreground group
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    m = re.search(r"asp train: interrupted; the newest checkpoint is (\S+)\. Resume from it with:\n  (.+)", stderr)
    assert m, stderr[-3000:]
    assert Path(m.group(1)).is_dir() and Path(m.group(1)).parent == out / "checkpoints"
    _, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive, [(q.pid, q.name()) for q in alive]  # nothing of the run is left running

    resume = shlex.split(m.group(2))
    assert resume[:2] == ["asp", "train"] and "resume=true" in resume
    r = subprocess.run([sys.executable, "-m", "asp_ascend.cli", *resume[1:]], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "resuming from iter_" in r.stderr
    assert (out / "summary.json").is_file() and (out / "previous" / "attempt_1").is_dir()
    assert re.search(r"iteration 8/8 ", r.stderr), r.stderr[-2000:]  # counted in the run's own iterations
    assert _foreign(r.stdout + r.stderr) == [], "\n".join(_foreign(r.stdout + r.stderr)[:30])
