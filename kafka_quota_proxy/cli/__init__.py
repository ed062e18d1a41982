"""The command line: the proxy itself, check-config, users, and the usage pipeline's commands."""
