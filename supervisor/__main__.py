"""Entry point of a job's supervisor: ``python -m trainctl.supervisor --home H --name N --fd K``.

Python's cyclic collector is off while the supervisor's modules load (its passes over
the import's objects cost ~5 ms of a ~65 ms boot here, on the cores a restarting job
starts on); boot.py freezes what was loaded and turns it back on before the supervisor
runs its loop.
"""

from __future__ import annotations

import gc

gc.disable()

import sys  # noqa: E402  (after the collector is off)

from .boot import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
