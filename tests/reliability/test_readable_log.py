"""`asp train`'s terminal output stays readable: third-party warnings go to train.log, actors
draw no progress bars, and no colour codes when the output is not a terminal."""
import warnings

from asp_ascend.pipeline.logger import actor_env, warnings_to_file


def test_warnings_go_to_the_log_file_not_the_terminal(tmp_path, capsys):
    restore = warnings_to_file(tmp_path / "train.log")
    try:
        warnings.warn("some library is deprecated", DeprecationWarning, stacklevel=1)
        warnings.warn("another notice", UserWarning, stacklevel=1)
        import logging

        logging.getLogger("ray").warning("Token authentication is enabled for this Ray cluster")
    finally:
        restore()
    err = capsys.readouterr().err
    assert "deprecated" not in err and "another notice" not in err
    log = (tmp_path / "train.log").read_text()
    assert "some library is deprecated" in log and "another notice" in log
    assert "Token authentication" in log and "Token authentication" not in err
    with warnings.catch_warnings(record=True) as seen:  # restored: warnings behave as before
        warnings.simplefilter("always")
        warnings.warn("after", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["after"]


def test_actor_env_has_no_bars_and_no_colour_off_a_terminal():
    piped, tty = actor_env("1", tty=False), actor_env("1", tty=True)
    assert piped["TQDM_DISABLE"] == tty["TQDM_DISABLE"] == "1"
    assert piped["NO_COLOR"] == "1" and piped["VLLM_LOGGING_COLOR"] == "0"
    assert "NO_COLOR" not in tty


def test_actor_output_goes_to_the_log_file_also_from_its_child_processes(tmp_path):
    """What an engine actor does first: its stdout/stderr (Python warnings, C-level writes, the
    engine processes it starts) are appended to the run's train.log, not streamed to the driver."""
    import subprocess
    import sys

    from asp_ascend.io import ACTOR_LOG_ENV

    log = tmp_path / "train.log"
    log.write_text("driver line\n")
    code = ("import os, subprocess, sys, warnings\n"
            "from asp_ascend.io import output_to_actor_log\n"
            "output_to_actor_log()\n"
            "print('a print')\n"
            "warnings.warn('a FutureWarning of some library', FutureWarning)\n"
            "os.write(2, b'a C-level notice\\n')\n"
            "subprocess.run([sys.executable, '-c', 'print(\"from the engine process\")'], check=True)\n")
    p = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, ACTOR_LOG_ENV: str(log)},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""
    text = log.read_text()
    assert text.startswith("driver line\n")  # appended, never truncated
    for line in ("a print", "a FutureWarning of some library", "a C-level notice", "from the engine process"):
        assert line in text


def test_actor_runtime_env_names_the_log_only_when_asked(tmp_path):
    from asp_ascend.io import ACTOR_LOG_ENV
    from asp_ascend.pipeline.logger import actor_runtime_env

    to_log = actor_runtime_env("1", False, tmp_path / "train.log")
    assert to_log["env_vars"][ACTOR_LOG_ENV] == str((tmp_path / "train.log").resolve())
    assert ACTOR_LOG_ENV not in actor_runtime_env("1", False, None)["env_vars"]
