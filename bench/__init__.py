"""Benchmarks, run by `make bench`: measured and reported, never asserted (absolute times on a
shared machine drift, so results worth comparing are ratios measured in one run)."""
