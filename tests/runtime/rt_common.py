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
