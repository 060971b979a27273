"""Adapter pieces against real MindSpeed-RL code on CPU: TransferDock, advantages, loss registry.

Runs when ASP_MINDSPEED_SRC points to a MindSpeed-RL checkout and tensordict is importable
(``pip install tensordict==0.8.1``, MindSpeed-RL's pin); skips otherwise. Checks what cannot be
checked statically: our group-contiguous rows are what MindSpeed-RL's group-norm advantage
groups together, the extra ``rollout_log_prob`` column round-trips, and rewriting the
advantages is what the ``actor_train`` consumer then reads.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

SRC = os.environ.get("ASP_MINDSPEED_SRC")
pytestmark = pytest.mark.skipif(not SRC, reason=("ASP_MINDSPEED_SRC is not set: point it at a MindSpeed-RL checkout at 05a90d7 (and ASP_VLLM_ASCEND_SRC at "
          "vllm-ascend 1b16c01); docs/ascend.md, 'Running the real-tree tests', says how to fetch them"))

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def msrl():
    pytest.importorskip("tensordict")
    import importlib

    import _msrl_cpu_hook

    _msrl_cpu_hook.install(SRC)
    td_mod = importlib.import_module("mindspeed_rl.trainer.utils.transfer_dock")
    cu = importlib.import_module("mindspeed_rl.trainer.utils.compute_utils")
    metric_cls = importlib.import_module("mindspeed_rl.utils.metrics").Metric
    here = str(Path(__file__).parent)
    path = os.pathsep.join([here, str(Path(__file__).parents[2]), *[p for p in sys.path if p]])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "ASP_MINDSPEED_SRC": SRC},
                          "worker_process_setup_hook": "_msrl_cpu_hook.install"})
    yield td_mod, cu, metric_cls
    ray.shutdown()
    # the stand-ins must not leak into later tests (torch_npu would look installed)
    for name in [m for m in sys.modules if m == "torch_npu" or m.split(".")[0] == "mindspeed_rl"]:
        del sys.modules[name]
    while SRC in sys.path:
        sys.path.remove(SRC)
    from asp_ascend.integrations.mindspeed_rl import trainer

    trainer._CACHE.clear()   # the loss class registered here belongs to the stand-in load


class _MainDock:
    """DataStrategy's td-strategy calls, as its put_main/clear_main make them."""

    def __init__(self, td):
        self.td = td

    def put_experience(self, data_dict, indexes, is_prompt=False):
        ray.get(self.td.put_experience.remote(data_dict=data_dict, indexes=indexes, is_prompt=is_prompt))

    def clear_main(self):
        ray.get(self.td.clear.remote())


def test_rows_advantages_and_reweighting_through_the_real_transfer_dock(msrl):
    from asp_ascend.integrations.mindspeed_rl.async_loop import SampleGroup, build_rows, reweight_advantages
    from asp_ascend.integrations.mindspeed_rl.trainer import ROLLOUT_LOG_PROB, TransferDockStore

    td_mod, cu, metric_cls = msrl
    gbs, n = 4, 3
    g = torch.Generator().manual_seed(0)
    groups = []
    for j in range(gbs):
        lens = [2 + (j + s) % 4 for s in range(n)]
        groups.append(SampleGroup(0, str(j), 0, 0, j % 2, 0, [5, 6, j], [list(range(1, L + 1)) for L in lens],
                                  [(-torch.rand(L, generator=g)).tolist() for L in lens], {"labels": [j]},
                                  rewards=[float((j * n + s) % 5) for s in range(n)]))
    td = td_mod.GRPOTransferDock.options(num_cpus=0).remote(
        prompts_num=gbs, n_samples_per_prompt=n, metrics=metric_cls(), addition_columns=["labels", ROLLOUT_LOG_PROB])
    from mindspeed_rl.utils.pad_process import remove_padding_tensor_dict_to_dict

    store = TransferDockStore(_MainDock(td), remove_padding_tensor_dict_to_dict)
    rows, idx = build_rows(groups, n, ("labels",))
    store.put_experience(rows, idx)
    # MindSpeed-RL's own group-norm advantages, over our rows
    tok = types.SimpleNamespace(pad=0, eod=0)
    ray.get(cu.compute_advantage.options(num_cpus=0).remote(
        td, 1.0, 0.95, adv_estimator="group_norm", experience_count=gbs * n, tokenizer=tok,
        global_batch_size=gbs * n, guarantee_order=True, n_sample_per_prompt=n))
    cols = store.read_columns(["advantages", "response_length", ROLLOUT_LOG_PROB], idx)
    scores = torch.tensor([r for grp in groups for r in grp.rewards], dtype=torch.float64).reshape(gbs, n)
    expect = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).reshape(-1)
    for r, (adv, rl) in enumerate(zip(cols["advantages"], cols["response_length"])):
        L = int(rl.reshape(-1)[0])
        assert torch.allclose(adv.reshape(-1)[:L].double(), expect[r].expand(L), atol=1e-5), f"row {r}"
        assert torch.equal(cols[ROLLOUT_LOG_PROB][r], rows[ROLLOUT_LOG_PROB][r])
    # old log-probs as compute_log_prob writes them: fire-and-forget (collect_transfer_dock_data without
    # sync), then the off-policy reweighting, whose read waits in the dock until they have landed
    old = [lp + 0.1 * (k % 3) for k, lp in enumerate(rows[ROLLOUT_LOG_PROB])]
    in_flight = td.put_experience.remote(data_dict={"old_log_prob": old}, indexes=idx)
    stats = reweight_advantages(store, idx, "decoupled_ppo", 2.0)
    ray.get(in_flight)
    assert stats["is_weight_max"] > 1.0
    # what the update (consumer actor_train) reads: the reweighted advantages
    batch, got_idx = ray.get(td.get_experience.remote("actor_train", ["advantages", "response_length"],
                                                      gbs * n, indexes=idx))
    from mindspeed_rl.utils.pad_process import remove_padding_tensor_dict_to_dict

    batch = remove_padding_tensor_dict_to_dict(batch)
    for k, r in enumerate(got_idx):
        L = int(batch["response_length"][k].reshape(-1)[0])
        w = torch.exp(old[r] - rows[ROLLOUT_LOG_PROB][r])
        assert torch.allclose(batch["advantages"][k].reshape(-1)[:L].double(), (expect[r] * w).double(), atol=1e-5)
    store.clear_main()   # the end of an iteration: every column empty again
    assert ray.get(td.get_experience_status.remote())["advantages"].sum() == 0


def test_offpolicy_loss_registration_with_the_real_loss_registry(msrl):
    import importlib

    for pkg in ("mindspeed_rl.models", "mindspeed_rl.models.loss"):
        if pkg not in sys.modules:
            m = types.ModuleType(pkg)
            m.__path__ = [os.path.join(SRC, *pkg.split("."))]
            sys.modules[pkg] = m
    from asp_ascend.integrations.mindspeed_rl.trainer import register_offpolicy_loss

    base = importlib.import_module("mindspeed_rl.models.loss.grpo_actor_loss_func").GRPOActorLossFunc
    factory = importlib.import_module("mindspeed_rl.models.loss.loss_func_factory").LossFuncFactory
    cls = register_offpolicy_loss()
    assert issubclass(cls, base) and cls is not base
    assert factory.get_class("ray_grpo", "actor") is cls       # what BaseTrainingEngine will construct
    loss = factory.get_instance("ray_grpo", "actor")
    with pytest.raises(RuntimeError, match="no old_log_prob"):
        loss.compute_loss(torch.zeros(1, 4, 8), {"responses": torch.ones(1, 3, dtype=torch.long)})
