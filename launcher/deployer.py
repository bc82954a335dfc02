"""A deploy's deployer: ``python -m trainctl.launcher.deployer HOME NAME ID``.

Started, detached (a session of its own, stdio on /dev/null), by `trainctl deploy`, which
only follows the files it writes (launcher/ops/deploy.py says what it does). It exits 0
once the new code runs (its own supervisor holds it to the gate and probation and writes
the report, ``deploys/ID.report.json``), 1 when the deploy ended before (its report
written here).
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainctl.launcher.config import load_config
from trainctl.launcher.ops.deploy import execute


def main(argv: list[str]) -> int:
    """Run one deploy to its end."""
    if len(argv) != 3:
        sys.stderr.write("usage: python -m trainctl.launcher.deployer HOME NAME ID\n")
        return 2
    home, name, did = Path(argv[0]), argv[1], argv[2]
    report = execute(home, name, did, load_config())
    return 0 if report is None or report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
