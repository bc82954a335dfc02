"""The console-script entry: `status` and `stop` answered without importing click.

`trainctl status NAME` is what monitoring loops and shell prompts call over and over, and
`stop` is timed against a bare `kill` loop, so both must start fast; click alone costs
~20 ms to import on these machines. The simple shapes

    [--home DIR] status NAME [--json]
    [--home DIR] stop NAME [--json] [--main-only] [--grace SECONDS] [--order ORDER]

are therefore parsed here by hand. Every other command line, including any help, typo or
unusual spelling, goes through click unchanged. Both paths call the same functions, render
with the same code and map errors with the same table (a test compares their output).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from trainctl.supervisor.errors import TrainctlError

from .exitcodes import exit_code_for
from .globalopts import global_options_end

_FLAGS = {"status": {"--json"}, "stop": {"--json", "--main-only"}}
_VALUED = {"status": set(), "stop": {"--grace", "--order"}}


@dataclass(frozen=True, slots=True)
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


def run(call: FastCall) -> int:
    """Run a parsed call exactly as the click command would."""
    from . import render  # noqa: PLC0415
    from .config import resolve_home  # noqa: PLC0415

    try:
        home = resolve_home(call.home, None)
        if call.verb == "status":
            from . import views  # noqa: PLC0415

            s = views.job_status(home, call.name)
            render.status_doc(s) if "--json" in call.flags else render.status(s)
            return views.status_exit_code(s)
        from .inputs import parse_seconds  # noqa: PLC0415
        from .stop import prepare_stop, stop_exit_code, stop_job, stop_order_of  # noqa: PLC0415

        as_json = "--json" in call.flags
        grace = call.values.get("--grace")  # flags are checked before anything is done
        grace_s = None if grace is None else parse_seconds(grace, "--grace")
        order = stop_order_of(call.values.get("--order"), main_only="--main-only" in call.flags)
        pre = prepare_stop(home, call.name, say=(lambda _l: None) if as_json else print)
        from trainctl.supervisor.state import job_dir  # noqa: PLC0415

        from .live import run_with_feedback  # noqa: PLC0415

        res = run_with_feedback(
            job_dir(home, call.name),
            call.name,
            lambda: stop_job(home, call.name, grace_s=grace_s, order=order),
            enabled=not as_json,
        )
        if isinstance(res, int):
            return res
        render.stop_doc(res, pre) if as_json else render.stop(res)
        return stop_exit_code(res)
    except TrainctlError as e:
        sys.stderr.write(f"trainctl: error: {e}\n")
        return exit_code_for(e)
    except KeyboardInterrupt:
        sys.stderr.write("trainctl: interrupted\n")
        return 130
    except Exception:  # noqa: BLE001  (last resort: never show a traceback to a user)
        from .cli import internal_error  # noqa: PLC0415

        return internal_error()


def _remote(argv: list[str]) -> int | None:
    """Run the command on --host / $TRAINCTL_HOST if one is given (None: run it here)."""
    given = argv[: global_options_end(argv)]  # a job's own `--host 0.0.0.0` is not ours
    if not any(a == "--host" or a.startswith("--host=") for a in given) and not os.environ.get(
        "TRAINCTL_HOST"
    ):
        if os.environ.get("TRAINCTL_CLIENT_VERSION"):  # we are the remote end of --host
            from .remote import check_client_version  # noqa: PLC0415

            try:
                check_client_version()
            except TrainctlError as e:
                sys.stderr.write(f"trainctl: error: {e}\n")
                return exit_code_for(e)
        return None
    from .remote import run_remote, split_host  # noqa: PLC0415

    try:
        host, rest = split_host(argv)
        if host is None or rest[:1] == ["hosts"]:
            return None
        return run_remote(host, rest)
    except TrainctlError as e:
        sys.stderr.write(f"trainctl: error: {e}\n")
        return exit_code_for(e)


def main() -> None:
    """Entry point of the `trainctl` script."""
    remote = _remote(sys.argv[1:])
    if remote is not None:
        sys.exit(remote)
    call = parse(sys.argv[1:])
    if call is not None and "TRAINCTL_NO_FASTPATH" not in os.environ:
        code = run(call)
        sys.stdout.flush()
        sys.exit(code)
    from .cli import main as click_main  # noqa: PLC0415

    click_main()
