"""Turning YAML files and command-line flags into typed settings."""

from .errors import ConfigError
from .settings import HostPort, Settings, load_file, merge, parse_host_port

__all__ = ["ConfigError", "HostPort", "Settings", "load_file", "merge", "parse_host_port"]
