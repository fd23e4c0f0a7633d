"""Validation harness and kernel benchmarks."""
