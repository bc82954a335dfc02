"""The CLI's start-up keeps Python's cyclic collector off while its modules load (each
import makes thousands of objects: ~2 ms of a ~40 ms `status`), and turns it back on
for every verb that may run long: only a read-only fast-path verb (`status NAME`) runs
and exits without it. A verb that ran for days without the collector would grow."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import Harness

# runs the console script's own entry with verbs.load watched: what the collector is
# when the verb's module is asked for (after every start-up import)
PROBE = """
import gc, sys
from trainctl.launcher import entry, verbs
print("at start-up:", gc.isenabled(), file=sys.stderr)
real = verbs.load
def load(name):
    print("verb", name, gc.isenabled(), file=sys.stderr)
    return real(name)
verbs.load = load
sys.argv = ["trainctl", *sys.argv[1:]]
entry.main()
"""


@pytest.mark.parametrize(
    ("args", "verb", "on"),
    [
        (["status", "c"], "status", False),  # the fast path, read only: exits at once
        (["status", "c", "--json"], "status", False),
        (["list"], "list", True),  # through click
        (["logs", "c"], "logs", True),  # `logs -f` follows for days
        (["stop", "ghost"], "stop", True),  # the fast path, but a stop may wait its grace
    ],
)
def test_the_collector_is_off_only_while_modules_load(
    harness: Harness, args: list[str], verb: str, on: bool
) -> None:
    h = harness
    h.tc("start", "--name", "c", "--", "sleep", "600", check=True)
    p = subprocess.run([sys.executable, "-c", PROBE, *args], env=h.env, capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    said = [x for x in p.stderr.splitlines() if x.startswith(("at start-up:", "verb "))]
    assert said[0] == "at start-up: False", p.stderr
    assert f"verb {verb} {on}" in said, p.stderr
    h.tc("stop", "c", check=True)
