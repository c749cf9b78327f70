"""`python -m entrypoint`: the container's PID 1 (see entrypoint/cli.py)."""

import sys

from entrypoint.cli import main

sys.exit(main())
