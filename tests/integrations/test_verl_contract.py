"""`asp doctor --verl`: the adapter's contract against the installed verl."""
from __future__ import annotations

import subprocess
import sys

import pytest

from verl_fixtures import HAVE_VERL, SKIP_REASON


@pytest.mark.verl
@pytest.mark.skipif(not HAVE_VERL, reason=SKIP_REASON)
def test_doctor_verl_passes_on_the_installed_verl_and_fails_on_a_changed_one(tmp_path):
    import shutil

    from asp_ascend.integrations.apicheck import installed_root
    from asp_ascend.integrations.verl.contract import check_verl

    r = subprocess.run([sys.executable, "-m", "asp_ascend", "doctor", "--verl"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "checks passed" in r.stdout and "installed verl 0.9" in r.stdout
    # a verl whose _update_actor takes another argument and whose config lost a key
    root = installed_root("verl")
    fake = tmp_path / "site"
    for rel in ("verl/trainer/ppo", "verl/trainer/config", "verl/experimental/fully_async_policy/config"):
        (fake / rel).mkdir(parents=True)
    shutil.copytree(root / "verl", fake / "verl", dirs_exist_ok=True)
    rt = fake / "verl/trainer/ppo/ray_trainer.py"
    rt.write_text(rt.read_text().replace("def _update_actor(self, batch: DataProto)", "def _update_actor(self, data: DataProto)"))
    y = fake / "verl/trainer/config/_generated_ppo_trainer.yaml"
    y.write_text(y.read_text().replace("  balance_batch:", "  balance_batches:"))
    report = check_verl(fake)
    bad = "\n".join(f.line() for f in report.failures())
    assert not report.ok and "_update_actor" in bad and "trainer.balance_batch" in bad


@pytest.mark.skipif(HAVE_VERL, reason="checks what `asp doctor --verl` says where verl is absent")
def test_doctor_verl_without_verl_says_nothing_was_checked():
    """It used to print '0/1 checks passed; 1 mismatch(es): the adapter needs updating' when verl
    was simply not installed in this environment."""
    from asp_ascend.integrations.verl.contract import run_check

    status, text = run_check()
    assert status == 1
    assert "not checked: verl is not installed in this environment" in text and "ci/env.sh verl" in text
    assert "checks passed" not in text and "mismatch" not in text
