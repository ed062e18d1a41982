"""Development-only tools, kept out of the installed package: the demo, and the one Tansu
launcher that the demo, the tests and the benchmarks share."""
