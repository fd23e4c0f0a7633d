"""The alert rules, judged by the real promtool (Debian's `prometheus` package): `promtool check
rules` passes, and for every alert `promtool test rules` fires it and keeps it quiet
(tests/monitoring/promtool_cases.py)."""

import re
import shutil
import subprocess

import pytest
import yaml

from tests.monitoring.promtool_cases import CASES, unit_test_file
from tests.monitoring.support import ALERT_RULES

pytestmark = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed (apt: prometheus)")


def _alerts() -> list[str]:
    rules = yaml.safe_load(ALERT_RULES.read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules_passes():
    done = subprocess.run(["promtool", "check", "rules", str(ALERT_RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    assert sorted(CASES) == sorted(_alerts())
    for name, cases in CASES.items():
        assert any(expected for _, _, expected in cases), name
        if name != "Watchdog":  # always firing by design
            assert any(not expected for _, _, expected in cases), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_promtool_unit_tests(tmp_path, name):
    spec = tmp_path / f"{name}.yml"
    spec.write_text(yaml.safe_dump(unit_test_file([str(ALERT_RULES)], name), sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_expectation_fails(tmp_path):
    """The unit tests can fail: a quiet case expected to fire is reported as such."""
    doc = unit_test_file([str(ALERT_RULES)], "DSV4GPUXid")
    quiet = next(t for t in doc["tests"] if not t["alert_rule_test"][0]["exp_alerts"])
    quiet["alert_rule_test"][0]["exp_alerts"] = doc["tests"][0]["alert_rule_test"][0]["exp_alerts"]
    spec = tmp_path / "broken.yml"
    spec.write_text(yaml.safe_dump(doc))
    done = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "FAILED" in out and re.search(r"got:\s*\[\s*\]", out), out
