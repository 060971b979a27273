"""Run logging: metrics.jsonl always, TensorBoard when enabled, wandb when configured,
and a terminal progress line per iteration. A disabled sink is a no-op object, so the
loop never needs an ``if`` around a logging call.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..io import ACTOR_LOG_ENV, json_default


def warnings_to_file(path: Path):
    """Third-party noise of the driver goes to ``path`` (``train.log``) instead of the terminal,
    so the progress lines stay readable: Python warnings (deprecations and the like), Ray's own
    log lines (cluster start, token notice) and Hugging Face progress bars. Returns the function
    that restores the previous behaviour."""
    import logging

    try:  # Ray sets up its loggers' handlers on its first import: ours must come after
        import ray  # noqa: F401
    except ImportError:
        pass
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved = []
    for name in ("py.warnings", "ray"):
        log = logging.getLogger(name)
        saved.append((log, list(log.handlers), log.propagate))
        for h in list(log.handlers):
            log.removeHandler(h)
        log.addHandler(handler)
        log.propagate = False
    logging.captureWarnings(True)
    bars = _hf_progress_bars(False)

    def restore() -> None:
        logging.captureWarnings(False)
        for log, handlers, propagate in saved:
            log.removeHandler(handler)
            for h in handlers:
                log.addHandler(h)
            log.propagate = propagate
        handler.close()
        _hf_progress_bars(bars)

    return restore


def _hf_progress_bars(on: bool) -> bool:
    """Switch Hugging Face's progress bars (model saving and loading) on or off; returns whether they were on."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return on
    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()
    return was


def actor_env(kv_cache_gib: str, tty: bool) -> dict:
    """Environment of the rollout and trainer actors: quiet vLLM, no progress bars (their lines
    reach the driver's terminal through Ray, where bars nest and garble), no colour codes when
    the driver's output is not a terminal."""
    import os

    env = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"), "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", kv_cache_gib), "TQDM_DISABLE": "1"}
    if not tty:
        env.update({"NO_COLOR": "1", "VLLM_LOGGING_COLOR": "0"})
    return env


def actor_runtime_env(kv_cache_gib: str, tty: bool, log_path: Path | None) -> dict:
    """Ray ``runtime_env`` of the rollout and trainer actors: :func:`actor_env`, and with
    ``log_path`` (``logging.actor_output: log``) their output appended to that file."""
    env = {"env_vars": actor_env(kv_cache_gib, tty)}
    if log_path is not None:  # the engines call io.output_to_actor_log() first thing
        env["env_vars"][ACTOR_LOG_ENV] = str(Path(log_path).resolve())
    return env


class _Null:
    def add_scalar(self, *a, **k):
        pass

    def log(self, *a, **k):
        pass

    def close(self):
        pass

    def finish(self):
        pass


class RunLogger:
    def __init__(self, out_dir: Path, *, tensorboard: bool, wandb_project: str | None, progress: bool,
                 total_iterations: int, config: dict | None = None, append: bool = False):
        self.out = Path(out_dir)
        self.metrics_path = self.out / "metrics.jsonl"
        self._fh = open(self.metrics_path, "a" if append else "w")
        self.progress = progress
        self.total = total_iterations
        self.t0 = time.time()
        self.tb = _Null()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(self.out / "tensorboard"))
        self.wandb = _Null()
        if wandb_project:
            try:
                import wandb
            except ImportError:
                self.say(f"logging.wandb_project={wandb_project!r} but wandb is not installed "
                         "(pip install wandb); logging to JSONL and TensorBoard only")
            else:
                self.wandb = wandb.init(project=wandb_project, dir=str(self.out), config=config or {})

    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[asp train {time.time() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def log_iteration(self, row: dict) -> None:
        """One row of metrics.jsonl (one per iteration) + TensorBoard/wandb scalars + progress line."""
        self._fh.write(json.dumps(row, default=json_default) + "\n")
        self._fh.flush()
        step = int(row["iteration"])
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "iteration":
                self.tb.add_scalar(k, v, step)
        self.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
        every = max(1, self.total // 32)  # about 32 progress lines per run, plus evaluations
        if self.progress and (step % every == every - 1 or step + 1 == self.total or "eval_reward_mean" in row):
            ev = f" | eval {row['eval_reward_mean']:.3f}" if "eval_reward_mean" in row else ""
            self.say(f"iteration {step + 1}/{self.total} v{row['policy_version']} | reward {row['reward_mean']:.3f}"
                     f" | resp len {row['response_length_mean']:.1f} | lag max {row['policy_lag_max']}"
                     f" | {row['iteration_time_s']:.2f} s/it | {row['throughput']:.0f} tok/s"
                     f" | queue {row['queue_len']}{ev}")

    def log_side(self, name: str, row: dict) -> None:
        """A row of a side file (``eval.jsonl``, ``warm_start.jsonl``): metrics.jsonl stays one row per iteration."""
        with open(self.out / name, "a") as fh:
            fh.write(json.dumps(row, default=json_default) + "\n")

    def close(self) -> None:
        self._fh.close()
        self.tb.close()
        self.wandb.finish()
