"""`python -m jobgen.cli`: the same as the `jobgen` command."""
import sys

from .app import main

sys.exit(main())
