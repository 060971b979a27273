"""MindSpeed-RL adapter: run ASP + the async pipeline inside MindSpeed-RL's worker groups.

MindSpeed-RL (Ascend) is frozen upstream, so this package wraps and subclasses it and
never patches it. Importing ``mindspeed_rl`` needs torch_npu, CANN (``acl``), vllm and
vllm-ascend, so nothing here imports it at module import; the pieces that need it
(:func:`.trainer.make_async_grpo_trainer_class`, :func:`.offpolicy.register_offpolicy_loss`,
:mod:`.entry`) import it when called, through :func:`require_mindspeed`.

Torch-free or torch-only pieces, usable and tested on CPU:
- :mod:`.schedule_batches`: ``schedule.parquet`` -> ``data_iters`` for ``RayGRPOTrainer.fit``.
- :mod:`.async_loop`: the async trainer loop, written against Protocols of the
  worker-group methods it calls (MindSpeed-RL's ``RayActorGroup`` satisfies them).
- :mod:`.config_bridge`: MindSpeed-RL YAML + our ``asp:`` group -> :class:`asp_ascend.config.Config`.
- :mod:`.contract` + :mod:`.checker`: every name the adapter relies on, checked statically
  against a MindSpeed-RL source tree (``asp doctor --mindspeed-src PATH``).
"""
from __future__ import annotations

from ...errors import BackendMissingError

MINDSPEED_HINT = ("install MindSpeed-RL from source on an Ascend node (docs/ascend.md): clone "
                  "https://gitcode.com/Ascend/MindSpeed-RL (mirror: github.com/Ascend/MindSpeed-RL), put its root on PYTHONPATH and run from it; "
                  "it needs torch_npu, CANN, vllm and vllm-ascend")


def require_mindspeed(purpose: str = "the MindSpeed-RL adapter"):
    """Import ``mindspeed_rl`` (the trainer package) or raise BackendMissingError saying what to install.

    The PyPI package named ``mindspeed-rl`` is an empty placeholder; a real install
    has ``mindspeed_rl.trainer``. A failing import inside (torch_npu, acl, vllm_ascend
    missing) is reported with the module that is missing.
    """
    import_mindspeed("mindspeed_rl.trainer.grpo_trainer_hybrid", purpose)
    import mindspeed_rl

    return mindspeed_rl


def import_mindspeed(module: str, purpose: str = "the MindSpeed-RL adapter"):
    """Import one MindSpeed-RL module, turning a missing dependency into BackendMissingError."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or "mindspeed_rl"
        if missing.split(".")[0] == "mindspeed_rl":
            raise BackendMissingError("mindspeed_rl", MINDSPEED_HINT, purpose) from exc
        raise BackendMissingError(missing, _hint_for(missing), f"{purpose} (imported by mindspeed_rl)") from exc


def _hint_for(module: str) -> str:
    top = module.split(".")[0]
    return {
        "torch_npu": "pip install torch_npu matching your torch and CANN (docs/ascend.md)",
        "acl": "install the CANN toolkit and `source /usr/local/Ascend/ascend-toolkit/set_env.sh`",
        "vllm": "install vllm from source with VLLM_TARGET_DEVICE=empty (docs/ascend.md)",
        "vllm_ascend": "install vllm-ascend at the commit docs/ascend.md pins",
        "mindspeed": "copy MindSpeed into the MindSpeed-RL root (docs/ascend.md)",
        "megatron": "copy Megatron-LM's megatron/ into the MindSpeed-RL root (docs/ascend.md)",
    }.get(top, f"pip install {top}")
