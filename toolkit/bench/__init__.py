"""The throughput sweep: config and checks, gates, the steady-state window, SLOs, the box-side helper, orchestration."""
