"""Bench records: the record, its provenance, the results repository, comparison, statistics, plots."""
