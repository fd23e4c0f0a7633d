"""``nvidia-smi`` on the quickstart box: eight RTX PRO 6000 Blackwell GPUs on driver 580.95.05.

It answers what dsv4kit and the role ask of it: ``-L`` (validate's preflight), ``--query-gpu=`` with
any fields tests/fake_nvidia_smi.py knows (rollout plan's probe, the bench's probe and sampler),
``topo -m`` (a PCIe box: two NUMA nodes of four GPUs), ``-i IDS`` (the units' preflight: an id the
box lacks is "No devices were found", exit 6).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import fake_nvidia_smi  # noqa: E402
from tests.verdict_standins import DRIVER, GPU  # noqa: E402

COUNT = 8


def main(argv: list[str]) -> int:
    import os

    driver = os.environ.get("DSV4_JOURNEY_DRIVER_FILE")  # the driver stage writes it when the module loads
    if driver and not os.path.exists(driver):
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    if "-L" in argv:
        for i in range(COUNT):
            print(f"GPU {i}: {GPU} (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)")
        return 0
    if argv[:2] == ["topo", "-m"]:
        print(topology())
        return 0
    ids = list(range(COUNT))
    if "-i" in argv:
        wanted = argv[argv.index("-i") + 1].split(",")
        ids = [int(i) for i in wanted if i.isdigit() and int(i) < COUNT]
        if not ids:
            print("No devices were found")
            return 6
        argv = [a for a in argv if a not in ("-i", argv[argv.index("-i") + 1])]
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is None:
        print(f"NVIDIA-SMI {DRIVER}   Driver Version: {DRIVER}   CUDA Version: 13.0")
        return 0
    fields = query.split(",")
    values = {**fake_nvidia_smi.VALUES, "driver_version": lambda i, t: DRIVER, "name": lambda i, t: GPU}
    looping = "-lms" in argv or any(a.startswith(("-lms=", "--loop-ms=")) for a in argv)
    if looping or any(f not in values for f in fields):  # a sampler, or a field the real tool refuses
        os.environ["FAKE_NVSMI_GPUS"] = str(COUNT)
        return fake_nvidia_smi.main(argv, values)
    for i in ids:
        print(", ".join(values[f](i, 0) for f in fields))
    return 0


def topology() -> str:
    """``nvidia-smi topo -m`` of a PCIe box without NVLink: NODE within a socket, SYS across."""
    names = [f"GPU{i}" for i in range(COUNT)]
    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity"]
    for i in range(COUNT):
        links = ["X" if i == j else ("NODE" if i // 4 == j // 4 else "SYS") for j in range(COUNT)]
        cpus = "0-47" if i < 4 else "48-95"
        lines.append(f"GPU{i}\t" + "\t".join(links) + f"\t{cpus}\t{i // 4}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
