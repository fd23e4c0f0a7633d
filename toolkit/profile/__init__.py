"""``dsv4kit profile``: where the decode GPU time goes on the live server (docs/profiling.md)."""
