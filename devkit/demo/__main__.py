"""`python -m devkit.demo`: what `make demo` runs."""

import sys

from devkit.demo.run import main

if __name__ == "__main__":
    if any(a == "--replicas" or a.startswith("--replicas=") for a in sys.argv[1:]):
        from devkit.demo.replicas import main as replicas_main

        sys.exit(replicas_main(sys.argv[1:]))
    sys.exit(main(sys.argv[1:]))
