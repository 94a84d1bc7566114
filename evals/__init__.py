"""Benchmarks and evals: `nightshift eval SUITE` runs one; each prints a table and writes CSV."""
