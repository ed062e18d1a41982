"""`python -m devkit.demo`: what `make demo` runs."""

import sys

from devkit.demo.run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
