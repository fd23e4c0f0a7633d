"""The serving stack as ``bench``, ``eval``, ``profile`` and the chat ``api`` check reach it.

``session.py``: ``ServingSession``, one object per connected box: the router, decode and prefill
addresses from the inventory, the API key's environment, readiness, ``/server_info``, the probe,
and the restarts. ``remote.py``: ``Remote``, the box-side steps over one SSH session, and the
context-length restart. ``arms.py``: the A/B arms and their restarts. ``pins.py``: every ``auto``
pinned to what the units run now before a restart. ``served_model.py``: the names the model is
served under, and the ``served_model`` gate. ``box/``: the box-side package (standard library
only), copied to the box as ``dsv4box``.
"""
