"""Children that are stopped (SIGSTOP, state T) when the stop begins.

A stopped process holds SIGTERM pending until it is continued: the stop must SIGCONT it,
and then it exits on SIGTERM with no need for SIGKILL.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ready, wait_files  # noqa: E402

flags = []
for i in range(2):
    flag = child_flag(f"stopped{i}")
    flags.append(flag)
    if os.fork() == 0:
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)
        forever()
wait_files(flags)
ready()
forever()
