"""Main + 3 children, all ignoring TERM, INT and HUP: only SIGKILL ends them."""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ignore, ready, wait_files  # noqa: E402

ignore(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
flags = []
for i in range(3):
    flag = child_flag(f"c{i}")
    flags.append(flag)
    if os.fork() == 0:
        open(flag, "w").close()
        forever()
wait_files(flags)
ready()
forever()
