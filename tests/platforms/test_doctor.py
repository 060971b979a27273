"""asp doctor: versions, backends with reasons, JSON, and the adapter contract check from the CLI."""
from __future__ import annotations

import json

from asp_ascend.cli import main
from asp_ascend.platforms.doctor import PACKAGES, collect


def test_report_has_every_package_and_backend():
    r = collect()
    assert r["schema_version"] == 1 and r["platform"] in ("cpu", "cuda", "npu")
    assert set(r["versions"]) == set(PACKAGES)
    for name in ("cpu", "cuda", "npu", "ray", "vllm_rollout", "weight_sync_object_store", "weight_sync_broadcast_hccl",
                 "mindspeed_rl_adapter"):
        b = r["backends"][name]
        assert isinstance(b["usable"], bool)
        assert b["usable"] or b["reason"], f"{name} is not usable but says no reason"
    assert r["backends"]["npu"]["comm_backend"] == "hccl"


def test_cli_json_and_text(capsys):
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backends"]["cpu"]["comm_backend"] == "gloo"
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "backends:" in text and "torch_npu" in text and "CANN" in text


def test_bad_mindspeed_src_fails_with_a_pointer(tmp_path, capsys):
    assert main(["doctor", "--mindspeed-src", str(tmp_path)]) == 1
    assert "has no mindspeed_rl/ package" in capsys.readouterr().out
    assert main(["doctor", "--json", "--mindspeed-src", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["mindspeed_check"]["ok"] is False and "backends" in data


def test_vllm_ascend_src_needs_mindspeed_src(capsys):
    assert main(["doctor", "--vllm-ascend-src", "/nowhere"]) == 2
    assert "go with --mindspeed-src" in capsys.readouterr().err
