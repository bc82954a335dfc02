"""A main with unreaped zombie children (it never waits for them)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import forever, ready  # noqa: E402

for _ in range(5):
    if os.fork() == 0:
        os._exit(3)
# plus one live child that will become a zombie only when the stop kills it
if os.fork() == 0:
    forever()
ready()
forever()
