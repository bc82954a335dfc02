"""Entry point of a job's supervisor: ``python -m trainctl.supervisor --home H --name N --fd K``."""

from __future__ import annotations

import sys

from .boot import main

sys.exit(main(sys.argv[1:]))
