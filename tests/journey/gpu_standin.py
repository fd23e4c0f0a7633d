"""The one GPU stand-in of the quickstart box (tests/journey/quickstart_box.py), in the box venv.

* :func:`fake_cuda` (run by the venv's ``.pth`` line when ``DSV4_JOURNEY_FAKE_CUDA`` is set, which the
  venv's ``bin/python`` sets for validate's torch probe only): torch sees the box's eight GPUs.
* ``python -m dsv4kit.validation.harness ...`` (what `dsv4kit validate --gpu 7` runs on the box) runs
  :func:`harness`: the real harness, from the wheel validate shipped, on the Triton interpreter with
  two small cases (the kernels really run and are checked against their references), and the kernel
  verdict with tests/verdict_standins.py's timings in place of CUDA-graph replays. The report then
  says it ran on the box's GPU, as the real run's would. Nothing else about the report is changed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = "indexer:1x2x100x16,attention:c4-T1-H16-ps64-x64-L300"  # tests/rollout/test_kernel_plan.py's


def fake_cuda() -> None:
    import torch

    from tests.verdict_standins import GPU

    torch.cuda.device_count = lambda: 8
    torch.cuda.get_device_name = lambda index=0: GPU


def harness(argv: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.append(str(REPO))  # tests/ (after the shipped wheel, which stays the dsv4kit imported)
    from dsv4kit.validation import harness as real, verdict_run
    from tests import verdict_standins

    ctx = int(argv[argv.index("--ctx") + 1]) if "--ctx" in argv else 8192  # the verdict's shapes' context
    verdict_run.run = verdict_standins.stand_in_run(verdict_standins.issue_table(ctx))
    argv = [*argv, "--interpret", "--cases", CASES] if "--cases" not in argv else [*argv, "--interpret"]
    code = real.main(argv)
    path = Path(argv[argv.index("--json") + 1])
    report = json.loads(path.read_text())
    report["environment"].update(device="cuda", interpret=False, gpu=verdict_standins.GPU)
    path.write_text(json.dumps(report))
    return code


if __name__ == "__main__":
    sys.exit(harness(sys.argv[1:]))
