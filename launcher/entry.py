"""The console script: a plain stop's request, or a plain status's question, first
(launcher/early.py), a start's supervisor spawned (launcher/prespawn.py), then the CLI.

Kept to one import before the request goes out: everything the verb needs to follow
and render the stop loads while the job is already stopping (and the supervisor counts
the members a status shows while the status code loads).
"""

from __future__ import annotations

import gc

# No cyclic collection while the command's modules load: each import makes thousands of
# objects, and the collector's passes over them cost ~2 ms of a ~40 ms `status` here.
# main.py turns it back on before any verb that runs for long (start, logs -f, web).
gc.disable()

import os  # noqa: E402  (after the collector is off)
import sys  # noqa: E402

from trainctl.launcher import early, prespawn  # noqa: E402


def main() -> None:
    """Entry point of the `trainctl` script."""
    if "TRAINCTL_NO_EARLY" not in os.environ:  # the bench's side-by-side turns these off
        early.send(sys.argv[1:])
        prespawn.spawn(sys.argv[1:])  # a start's supervisor imports while the CLI does
    from trainctl.launcher.main import main as run  # noqa: PLC0415  (after the request is out)

    run()
