"""A child that moves itself into its own process group (setpgid(0, 0))."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ready, wait_files  # noqa: E402

flag = child_flag("regrouped")
if os.fork() == 0:
    os.setpgid(0, 0)
    # grandchild in the new group too
    if os.fork() == 0:
        forever()
    open(flag, "w").close()
    forever()
wait_files([flag])
ready()
forever()
