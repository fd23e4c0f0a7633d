"""The software and device facts every validation artifact records (report, verdict, benchmarks)."""

from __future__ import annotations

import os
from typing import Optional


def software_versions() -> dict[str, Optional[str]]:
    """torch (and the CUDA it was built for), triton and dsv4kit versions; None where not importable."""
    from dsv4kit import __version__

    versions: dict[str, Optional[str]] = {"torch": None, "cuda": None, "triton": None, "dsv4kit": __version__}
    try:
        import torch

        versions["torch"], versions["cuda"] = torch.__version__, torch.version.cuda
    except ImportError:
        pass
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def torch_device(device: str) -> dict:
    """torch's view of the visible GPU on ``"cuda"``: its name, ``sm_XY`` and ``CUDA_VISIBLE_DEVICES``.

    Empty when torch is not importable; only ``torch`` on ``"cpu"``.
    """
    try:
        import torch
    except ImportError:
        return {}
    facts = {"torch": torch.__version__}
    if device == "cuda":
        facts.update(gpu=torch.cuda.get_device_name(),
                     capability="sm_%d%d" % torch.cuda.get_device_capability(),
                     cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    return facts
