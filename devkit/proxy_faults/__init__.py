"""Proxy faults under load (docs/reliability.md, "Proxy faults"): SIGTERM and kill -9 of a real
proxy process while real clients run through it, and the files that must survive a kill -9 in
the middle of being written. `python -m devkit.proxy_faults` (`make faults-proxy`) runs the long
version and prints its figures; tests/integration/test_proxy_faults.py runs short ones."""
