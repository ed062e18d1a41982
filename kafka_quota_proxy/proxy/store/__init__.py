"""Quota state shared with other proxy replicas through Valkey/Redis."""
