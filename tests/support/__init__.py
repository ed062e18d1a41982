"""Test support: real brokers and proxies on free ports."""
