"""``python -m dsv4kit.rollout status [--json]`` (standard library only; see ``dsv4kit.rollout.status``)."""

import sys

from dsv4kit.rollout.status import main

sys.exit(main())
