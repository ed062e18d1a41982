"""Turning YAML files and command-line flags into typed settings."""

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.settings import HostPort, Settings, load_file, merge, parse_host_port

__all__ = ["ConfigError", "HostPort", "Settings", "load_file", "merge", "parse_host_port"]
