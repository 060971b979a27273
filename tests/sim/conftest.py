import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # sim_common.py lives next to the tests


@pytest.fixture
def simulate_calibrated(tmp_path):
    """``simulate_calibrated(timeline)``: write ``timeline`` as a small sync run (G = 2, 8 sequences per
    instance), run ``asp simulate --calibrate`` on it (``fully_async_fifo``, 64 prompts of sim_tiny.yaml),
    and return (calibration.json, the simulated system's summary)."""
    from asp_ascend.cli import main

    root = Path(__file__).resolve().parents[2]

    def run(timeline):
        src = tmp_path / "run"
        timeline.write_jsonl(src / "timeline.jsonl")
        (src / "config.yaml").write_text("rollout:\n  max_num_seqs: 8\npipeline:\n  mode: sync\n"
                                         "train:\n  group_size: 2\n  micro_batch_size: 64\n")
        out = tmp_path / "sim"
        rc = main(["simulate", str(root / "configs" / "sim_tiny.yaml"), f"output_dir={out}",
                   "workload.num_prompts=64", "sim.sweep_devices=[]", "sim.policies=[fully_async_fifo]",
                   "--calibrate", str(src)])
        assert rc == 0
        return (json.loads((out / "calibration.json").read_text()),
                json.loads((out / "simulation.json").read_text())["systems"]["fully_async_fifo"])
    return run
