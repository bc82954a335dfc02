"""A child that setsid()s and double-forks a daemon (the classic escape from a pgroup)."""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ready, wait_files  # noqa: E402

flag = child_flag("daemon")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # the daemon: new session, parent gone (reparented), ignores TERM like many do
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        open(flag, "w").close()
        forever()
    os._exit(0)
wait_files([flag])
ready()
forever()
