"""dsv4kit: bring-up toolkit and sm_120 kernels for DeepSeek-V4-Flash on SGLang 0.5.23.

This package must stay importable inside the SGLang venv on the GPU box, where only torch and
triton are present: no module imported from here may import typer, fabric or ansible at import
time. The CLI lives in ``dsv4kit.cli``.
"""

from dsv4kit._version import __version__

__all__ = ["__version__"]
