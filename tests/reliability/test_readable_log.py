"""`asp train`'s terminal output stays readable: third-party warnings go to train.log, actors
draw no progress bars, and no colour codes when the output is not a terminal."""
import warnings

from asp_ascend.pipeline.logger import actor_env, warnings_to_file


def test_warnings_go_to_the_log_file_not_the_terminal(tmp_path, capsys):
    restore = warnings_to_file(tmp_path / "train.log")
    try:
        warnings.warn("some library is deprecated", DeprecationWarning, stacklevel=1)
        warnings.warn("another notice", UserWarning, stacklevel=1)
    finally:
        restore()
    err = capsys.readouterr().err
    assert "deprecated" not in err and "another notice" not in err
    log = (tmp_path / "train.log").read_text()
    assert "some library is deprecated" in log and "another notice" in log
    with warnings.catch_warnings(record=True) as seen:  # restored: warnings behave as before
        warnings.simplefilter("always")
        warnings.warn("after", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["after"]


def test_actor_env_has_no_bars_and_no_colour_off_a_terminal():
    piped, tty = actor_env("1", tty=False), actor_env("1", tty=True)
    assert piped["TQDM_DISABLE"] == tty["TQDM_DISABLE"] == "1"
    assert piped["NO_COLOR"] == "1" and piped["VLLM_LOGGING_COLOR"] == "0"
    assert "NO_COLOR" not in tty
