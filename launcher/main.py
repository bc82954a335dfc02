"""The console-script entry: `--host`, then the fast path, then click.

`trainctl status NAME` is what monitoring loops and shell prompts call over and over, and
`stop` is timed against a bare `kill` loop, so both must start fast; click alone costs
~20 ms to import on these machines. The simple shapes

    [--home DIR] status NAME [--json]
    [--home DIR] stop NAME [--json] [--main-only] [--grace DURATION] [--order ORDER]

are therefore parsed here from the option table click's declarations are built from
(``options.py``), and handed to the same verb ``run()`` that click's callback
calls. Every other command line, including any help, typo or unusual spelling,
goes through click unchanged. Both end every error in ``exitcodes.exit_for_exception``,
and both write through ``output``'s stdout, which a closed pipe cannot break.
"""

from __future__ import annotations

import gc
import os
import sys

from trainctl.supervisor.errors import TrainctlError

from . import early, output, prespawn, verbs
from .exitcodes import ExitCode, exit_for_exception, say_error
from .globalopts import global_options_end
from .options import FastLine, parse_fast


def parse(argv: list[str]) -> FastLine | None:
    """Return the parsed call, or None to let click handle the command line."""
    return parse_fast(argv)


def run_fast(call: FastLine) -> int:
    """Run a parsed call through the verb's own ``run()``, exactly as click would."""
    inv = verbs.Invocation(call.home)
    try:
        return int(verbs.load(call.verb).run(inv, call.name, **call.given))
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001  (every error: the one mapping)
        return exit_for_exception(e)


def _remote(argv: list[str]) -> int | None:
    """Run the command on --host / $TRAINCTL_HOST if one is given (None: run it here)."""
    given = argv[: global_options_end(argv)]  # a job's own `--host 0.0.0.0` is not ours
    wanted = any(a == "--host" or a.startswith("--host=") for a in given)
    here = not wanted and not os.environ.get("TRAINCTL_HOST")
    if here and not os.environ.get("TRAINCTL_CLIENT_VERSION"):
        return None
    gc.enable()  # off while the modules loaded (entry.py): `logs -f` over ssh runs for days
    from . import remote  # noqa: PLC0415  (ssh, threads, subprocess: only for --host)

    try:
        if here:
            remote.check_client_version()  # we are the remote end of --host
            return None
        host, rest = remote.split_host(argv)
        if host is None or rest[:1] in (["hosts"], ["mcp"]):
            return None  # local verbs: `mcp` sends each tool call to the host itself
        return remote.run_remote(host, rest)
    except TrainctlError as e:
        return exit_for_exception(e)


def main() -> None:
    """Entry point of the `trainctl` script."""
    output.install()
    code = _remote(sys.argv[1:])
    quick = False  # a read-only verb run on the fast path: it may skip the teardown
    if code is None:
        call = parse(sys.argv[1:])
        if call is not None and "TRAINCTL_NO_FASTPATH" not in os.environ:
            quick = call.verb in READ_ONLY
            if not quick:
                gc.enable()  # off while the modules loaded (entry.py); a stop may run long
            code = run_fast(call)
        else:
            from .cli import main as click_main  # noqa: PLC0415  (click: ~20 ms, not for status)

            gc.enable()  # off while the modules loaded (entry.py): a verb may run for days
            code = click_main()
    if early.sent():  # a stop went out before the verb loaded: it is loaded by now
        verbs.load("stop").note_unclaimed(wait=code != ExitCode.INTERRUPTED)
    prespawn.dismiss()  # a start's supervisor that was not handed a spec: it exits
    sys.stdout.flush()
    lost = output.write_error()
    if lost is not None:  # what was done is done; the output asked for is not there
        say_error(f"error: cannot write the output: {lost.strerror or lost}")
        code = code or ExitCode.FAILED
    if quick and _alone():
        sys.stderr.flush()
        os._exit(code)  # nothing left to close or join: skip the interpreter's teardown
    sys.exit(code)


# Fast-path verbs that only read: once their output is flushed nothing of theirs is left
# to close or write. Skipping the interpreter's teardown (every module's dict, ~150 of
# them) saves 3-8 ms of a ~50 ms `status` here (scripts/bench.sh --only status).
READ_ONLY = frozenset({"status"})


def _alone() -> bool:
    """No thread but this one (a queued job's status may have started some): os._exit
    would cut one short where sys.exit waits for it."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1
