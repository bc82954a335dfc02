"""The console script: a plain stop's request, or a plain status's question, first
(launcher/early.py), then the CLI.

Kept to one import before the request goes out: everything the verb needs to follow
and render the stop loads while the job is already stopping (and the supervisor counts
the members a status shows while the status code loads).
"""

from __future__ import annotations

import os
import sys

from trainctl.launcher import early


def main() -> None:
    """Entry point of the `trainctl` script."""
    if "TRAINCTL_NO_EARLY" not in os.environ:  # the bench's side-by-side turns both off
        early.send(sys.argv[1:])
    from trainctl.launcher.main import main as run  # noqa: PLC0415  (after the request is out)

    run()
