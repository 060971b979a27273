"""Constants and helpers shared by the runtime tests."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu_tiny_grpo.yaml"
STACK = ("torch", "ray", "vllm", "transformers")

# A few iterations of the embedded default, shrunk: two unpinned instances sharing the cores.
SMALL = ["data.synthetic.num_prompts=32", "data.synthetic.num_eval_prompts=8", "data.synthetic.max_answer_length=24",
         "train.group_size=4", "train.global_batch_size=8", "train.mini_batch_size=4", "train.micro_batch_size=16",
         "train.warmup_sft_steps=10", "train.eval_every=2", "lengths.max_response_length=40",
         "rollout.max_num_seqs=16", "rollout.cpu_cores=[]", "train.cpu_cores=[]", "logging.progress=false"]


def stack_missing() -> str | None:
    missing = [m for m in STACK if importlib.util.find_spec(m) is None]
    return f"runtime stack not installed: {', '.join(missing)}" if missing else None


class BackgroundRun:
    """`asp train` in a thread, so a test can hurt one of its rollout instances mid-run."""

    def __init__(self, cfg):
        import threading

        from asp_ascend.pipeline.run import run_train

        self.cfg, self.result = cfg, {}

        def target():
            try:
                self.result["rc"] = run_train(cfg)
            except BaseException as exc:  # surfaced by join()
                self.result["error"] = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def wait_for_rows(self, n: int, timeout_s: float = 600) -> list[str]:
        """Block until metrics.jsonl has ``n`` rows (the run is then mid-way); returns them."""
        import time
        from pathlib import Path

        metrics = Path(self.cfg.output_dir) / "metrics.jsonl"
        deadline = time.time() + timeout_s
        rows: list[str] = []
        while time.time() < deadline and self.thread.is_alive():
            if metrics.exists() and len(rows := metrics.read_text().splitlines()) >= n:
                break
            time.sleep(0.1)
        assert self.thread.is_alive() and len(rows) >= n, self.result
        return rows

    @staticmethod
    def instance(index: int):
        """The named Ray actor of rollout instance ``index`` (names end in -<index>)."""
        import ray

        return ray.get_actor(next(n for n in ray.util.list_named_actors()
                                  if n.startswith("asp-rollout-") and n.endswith(f"-{index}")))

    def join(self, timeout_s: float = 900) -> None:
        self.thread.join(timeout=timeout_s)
        assert "error" not in self.result, self.result.get("error")
        assert self.result.get("rc") == 0


def assert_trained_exactly_once(out, cfg, tl) -> None:
    """Every (epoch, prompt, sample) of the schedule was trained exactly once, within the lag bound."""
    from collections import Counter

    import pandas as pd

    trained = Counter((e, p, s) for st in tl.events["step"] for e, p, s in st["samples"])
    sched = pd.read_parquet(out / "schedule.parquet")
    expected = {(e, p, s) for e, p in zip(sched["epoch"], sched["prompt_id"]) for s in range(cfg.train.group_size)}
    assert set(trained) == expected and set(trained.values()) == {1}
    req = tl.frame("request")
    assert ((req["iteration"] - req["admission_version"]) <= cfg.pipeline.lag_bound).all()


def ignores_positions(inner):
    """`inner` behind a forward that drops position_ids and the varlen kwargs: packed sequences
    then read as one long causal sequence and attend to each other (what the packing probe must refuse)."""
    import torch

    class IgnoresPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids, attention_mask=None, **_):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    return IgnoresPositions()
