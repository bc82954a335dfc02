"""The console-script entry: `--host`, then the fast path, then click.

`trainctl status NAME` is what monitoring loops and shell prompts call over and over, and
`stop` is timed against a bare `kill` loop, so both must start fast; click alone costs
~20 ms to import on these machines. The simple shapes

    [--home DIR] status NAME [--json]
    [--home DIR] stop NAME [--json] [--main-only] [--grace SECONDS] [--order ORDER]

are therefore parsed here by hand and handed to the same verb ``run()`` that click's
callback calls. Every other command line, including any help, typo or unusual spelling,
goes through click unchanged. Both end every error in ``exitcodes.exit_for_exception``,
and both write through ``output``'s stdout, which a closed pipe cannot break.
"""

from __future__ import annotations

import os
import sys

from trainctl.supervisor.errors import TrainctlError
from trainctl.supervisor.records import record

from . import early, output, verbs
from .exitcodes import ExitCode, exit_for_exception
from .globalopts import global_options_end

_FLAGS = {"status": {"--json"}, "stop": {"--json", "--main-only"}}
_VALUED = {"status": set(), "stop": {"--grace", "--order"}}


@record(frozen=True)
class FastCall:
    """A command line the fast path can serve."""

    verb: str
    name: str
    home: str | None
    flags: frozenset[str]
    values: dict[str, str]


def parse(argv: list[str]) -> FastCall | None:
    """Return the parsed call, or None to let click handle the command line."""
    home = None
    if argv[:1] == ["--home"] and len(argv) >= 2:
        home, argv = argv[1], argv[2:]
        if not home:
            return None  # click refuses the empty value in its one line
    if len(argv) < 2 or argv[0] not in _FLAGS or argv[1].startswith("-"):
        return None
    verb, name, rest = argv[0], argv[1], argv[2:]
    flags: set[str] = set()
    values: dict[str, str] = {}
    while rest:
        arg = rest.pop(0)
        if arg in _FLAGS[verb] and arg not in flags:
            flags.add(arg)
        elif arg in _VALUED[verb] and arg not in values and rest:
            values[arg] = rest.pop(0)
        else:
            return None
    return FastCall(verb, name, home, frozenset(flags), values)


def run_fast(call: FastCall) -> int:
    """Run a parsed call through the verb's own ``run()``, exactly as click would."""
    inv = verbs.Invocation(call.home)
    as_json = "--json" in call.flags
    try:
        if call.verb == "status":
            return int(verbs.load("status").run(inv, call.name, as_json=as_json))
        return int(
            verbs.load("stop").run(
                inv,
                call.name,
                grace=call.values.get("--grace"),
                order=call.values.get("--order"),
                main_only="--main-only" in call.flags,
                as_json=as_json,
            )
        )
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001  (every error: the one mapping)
        return exit_for_exception(e)


def _remote(argv: list[str]) -> int | None:
    """Run the command on --host / $TRAINCTL_HOST if one is given (None: run it here)."""
    given = argv[: global_options_end(argv)]  # a job's own `--host 0.0.0.0` is not ours
    wanted = any(a == "--host" or a.startswith("--host=") for a in given)
    here = not wanted and not os.environ.get("TRAINCTL_HOST")
    if here and not os.environ.get("TRAINCTL_CLIENT_VERSION"):
        return None
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
    if code is None:
        call = parse(sys.argv[1:])
        if call is not None and "TRAINCTL_NO_FASTPATH" not in os.environ:
            code = run_fast(call)
        else:
            from .cli import main as click_main  # noqa: PLC0415  (click: ~20 ms, not for status)

            code = click_main()
    if early.sent():  # a stop went out before the verb loaded: it is loaded by now
        verbs.load("stop").note_unclaimed(wait=code != ExitCode.INTERRUPTED)
    sys.stdout.flush()
    sys.exit(code)
