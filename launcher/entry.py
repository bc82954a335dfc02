"""The console script: a plain stop's request first (launcher/early.py), then the CLI.

Kept to one import before the request goes out: everything the verb needs to follow
and render the stop loads while the job is already stopping.
"""

from __future__ import annotations

import os
import sys

from trainctl.launcher import early


def main() -> None:
    """Entry point of the `trainctl` script."""
    if "TRAINCTL_NO_EARLY_STOP" not in os.environ:  # the bench's side-by-side turns it off
        early.send_stop(sys.argv[1:])
    from trainctl.launcher.main import main as run  # noqa: PLC0415  (after the request is out)

    run()
