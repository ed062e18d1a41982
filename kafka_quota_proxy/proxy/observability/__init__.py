"""Metrics and the usage log."""
