"""The demo `make demo` runs: a Tansu broker, the proxy enforcing one quota, two producers and
a consumer through it, with a live view."""
