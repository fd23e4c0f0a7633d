"""The error the kernels raise for arguments they refuse.

Raised by the host-side checks, before any launch (so never half-way through a captured
region). It is a ValueError and a TypeError, so callers that caught either keep working; the
SGLang plugin catches exactly this class to hand a refused call to SGLang's original.
"""


class KernelArgumentError(ValueError, TypeError):
    """An argument the kernel does not accept; the message names it."""
