"""A child that setsid()s, double-forks and execs with a scrubbed environment.

The marker is gone from the daemon's environ; it must still be caught (cgroup, or the
supervisor as subreaper, or its parent links).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ready, wait_files  # noqa: E402

flag = child_flag("scrubbed")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"open({flag!r}, 'w').close()\n"
            "time.sleep(600)\n"
        )
        # Only the test harness's own marker survives (so a leak would still be found and
        # cleaned up by the tests); TRAINCTL_JOB and everything else is gone.
        keep = {k: v for k, v in os.environ.items() if k in ("TCTEST_MARK", "TCTEST_BYSTANDER")}
        os.execve(sys.executable, [sys.executable, "-c", code], keep)
    os._exit(0)
wait_files([flag])
ready()
forever()
