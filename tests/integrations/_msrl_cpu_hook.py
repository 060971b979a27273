"""Load parts of a real MindSpeed-RL source tree on CPU (test helper; also a Ray worker setup hook).

``mindspeed_rl/__init__.py`` eagerly imports the whole package (vllm-ascend, CANN, ...). The
TransferDock and the advantage computation need only torch, ray and tensordict, so this
registers MindSpeed-RL's package directories without running their ``__init__`` files, and a
``torch_npu`` module holding only the MindStudio profiler range markers (``npu.mstx.range_start``
/ ``range_end``), which MindSpeed-RL's ``mstx_timer_decorator`` calls around functions; they
only annotate profiles. Nothing else of torch_npu is reached by the code used here.
"""
from __future__ import annotations

import os
import sys
import types

PACKAGES = ("mindspeed_rl", "mindspeed_rl.utils", "mindspeed_rl.trainer", "mindspeed_rl.trainer.utils")


def install(root: str | None = None) -> None:
    root = root or os.environ["ASP_MINDSPEED_SRC"]
    if root not in sys.path:
        sys.path.insert(0, root)
    if "torch_npu" not in sys.modules:
        npu = types.ModuleType("torch_npu")
        mstx = types.SimpleNamespace(range_start=lambda name: 0, range_end=lambda range_id: None)
        npu.npu = types.SimpleNamespace(mstx=mstx)
        sys.modules["torch_npu"] = npu
    for pkg in PACKAGES:
        if pkg not in sys.modules:
            m = types.ModuleType(pkg)
            m.__path__ = [os.path.join(root, *pkg.split("."))]
            sys.modules[pkg] = m
