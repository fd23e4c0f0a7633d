"""Where dsv4kit's files lie on a box (dsv4kit.core.box_paths)."""

from dsv4kit.core import box_paths
from dsv4kit.rollout import status


def test_paths_lie_under_the_hosts_prefix():
    assert box_paths.decision_file({}) == "/etc/dsv4kit/kernel-decision.json"
    assert box_paths.unit_dir({"dsv4_prefix": "/srv/b/"}) == "/srv/b/etc/systemd/system"
    assert box_paths.on_box({"dsv4_prefix": "/srv/b"}, box_paths.ROUTER_KEY_FILE) == "/srv/b/etc/dsv4kit/router-secret.env"


def test_the_box_side_status_reads_the_same_decision_file():
    # rollout.status runs on the box with the standard library only, so it keeps its own copy
    assert status.DEFAULT_DECISION_FILE == box_paths.DECISION_FILE
