"""The box side of ``dsv4kit bench``: a standard-library package copied to the box (as ``dsv4box``)
and run there with the SGLang venv python (``python -m dsv4box``).

``http``: the one loopback HTTP client. ``metrics``: the ``/metrics`` parse and series selection,
the scraper, the idle wait. ``telemetry``: ``nvidia-smi`` sampling. ``probe``: provenance.
``point``: ``run-point`` and ``prefill-point``. ``__main__``: the command line.
"""
