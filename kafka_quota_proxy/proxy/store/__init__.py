"""The quota state shared by proxy replicas and worker processes (issue 14)."""
