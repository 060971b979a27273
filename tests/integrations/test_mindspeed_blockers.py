"""The async path's start-up blockers, each planted back into a copy of our own code: the checker
(`asp doctor --mindspeed-src`) must report exactly the expectation that guards it.

Each plant reintroduces one blocker a review of the MindSpeed-RL async path found (instances on
the wrong devices or executor, weight loaders patched after the model exists, the mindspeed_rl
package imported into vLLM workers, resume without a start iteration or a first push, reads that
skip the TransferDock's wait). The guards sit next to the vLLM / Ray behaviour that makes each one
a blocker (asp_ascend/integrations/mindspeed_rl/contract_vllm.py)."""
from __future__ import annotations

import shutil

import pytest

from asp_ascend.integrations.apicheck import Checker, installed_root, ours_root
from asp_ascend.integrations.mindspeed_rl.contract_vllm import OURS

P = "asp_ascend/integrations/mindspeed_rl/"
RG, VR, SS, TR, EN = (P + f for f in ("rollout_groups.py", "vllm_receiver.py", "sample_source.py", "trainer.py",
                                      "entry.py"))

# blocker: [(file, old, new), ...], the guards that must fail as (kind, "file::scope")
PLANTS = {
    "1 TP instance on vLLM's Ray executor": (
        [(RG, "{\"distributed_executor_backend\": \"mp\", ", "{")],
        {("pattern", "rollout_groups.py::instance_engine_args")}),
    "1 placement group captured by the instance's children": (
        [(RG, "placement_group_capture_child_tasks=False", "placement_group_capture_child_tasks=True")],
        {("pattern", "rollout_groups.py::instance_actor_options")}),
    "1 devices never bound (every instance on npu:0..tp-1)": (
        [(RG, "self.devices = own_devices(platform, tensor_parallel_size, kw.get(\"instance\", \"?\"))",
          "self.devices = []")],
        {("order", "rollout_groups.py::instance_actor_class.InstanceEngine.__init__")}),
    "2 loaders patched after the model was built": (
        [(VR, "if os.environ.get(LOADERS_ENV):   # inside an instance's vLLM worker: before its model is built\n"
              "    install_megatron_loaders(os.environ[LOADERS_ENV])\n", ""),
         (VR, "loaders = installed_loaders()", "loaders = install_megatron_loaders(os.environ[LOADERS_ENV])")],
        {("pattern", "vllm_receiver.py::<module>")}),
    "2 mindspeed_rl package imported into vLLM workers": (
        [(VR, "loaders = installed_loaders()",
          "from . import import_mindspeed\n        loaders = import_mindspeed("
          "'mindspeed_rl.models.rollout.vllm_adapter.megatron_weight_loaders')")],
        {("pattern", "vllm_receiver.py")}),
    "2 load_megatron_weights (.cuda() without transfer_to_npu)": (
        [(VR, "load(params, model, cfg,", "loaders.load_megatron_weights(params, model, cfg,")],
        {("pattern", "vllm_receiver.py::MindSpeedWeightReceiver.asp_recv_megatron_weights")}),
    "3 snapshot read of the TransferDock": (
        [(TR, "batch, got = self.get(self.ds.td.get_experience.remote(self.CONSUMER, list(columns), indexes=want,\n"
              "                                                               get_n_samples=False))",
          "batch, got = self.get(self.ds.td.get_experience_data.remote()), want")],
        {("pattern", "trainer.py::TransferDockStore.read_columns"), ("pattern", "trainer.py")}),
    "4 plan built without the resume iteration": (
        [(SS, "Path(schedule_path), start_iteration)", "Path(schedule_path), 0)")],
        {("pattern", "sample_source.py::build_async_rollout")}),
    "4 resume iteration not read from the trainer": (
        [(EN, "start_iteration=actor.get_iteration(),", "")],
        {("pattern", "entry.py::_train")}),
    "4 no first weight push before admission": (
        [(SS, "    publish(plan.start)\n", "")],
        {("pattern", "sample_source.py::wire_source")}),
}

needs_vllm = pytest.mark.skipif(installed_root("vllm") is None, reason="vllm is not installed")


def _check(ours):
    return Checker({"ours": ours, "vllm": installed_root("vllm")}).run(OURS)


@needs_vllm
def test_our_code_passes_every_guard():
    r = _check(ours_root())
    assert r.ok and len(r.checked) == len(OURS), r.render("ours")


@needs_vllm
@pytest.mark.parametrize("blocker", list(PLANTS), ids=list(PLANTS))
def test_each_blocker_planted_back_is_reported(tmp_path, blocker):
    edits, expected = PLANTS[blocker]
    copy = tmp_path / "ours"
    shutil.copytree(ours_root() / "asp_ascend", copy / "asp_ascend", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, old, new in edits:
        text = (copy / rel).read_text()
        assert text.count(old) == 1, f"the plant for {blocker!r} no longer applies to {rel}"
        (copy / rel).write_text(text.replace(old, new))
    r = _check(copy)
    got = {(f.kind, f.where.rsplit("/", 1)[-1]) for f in r.failures()}
    assert got == expected, r.render(blocker)
    assert all(getattr(f.expectation, "why", "") for f in r.failures())
