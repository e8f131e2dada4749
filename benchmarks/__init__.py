"""Reproducible benchmarks. ``exactly bench`` runs them all and prints a table.

Each benchmark measures a candidate against a baseline side by side in one
run and reports the ratio, since the machines are shared and noisy."""
