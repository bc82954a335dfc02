"""`trainctl hosts`: the aliases of hosts.toml, and whether each is reachable."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.remote import HostRow, check_host, hosts_path, load_hosts

from . import Invocation


def run(inv: Invocation, *, check: bool = False, as_json: bool = False) -> int:
    """List the aliases; --check connects to each (exit 5 when one fails). hosts.toml is
    the client's own, not a home's."""
    rows = [HostRow(h, check_host(h) if check else None) for h in load_hosts().values()]
    if as_json:
        inv.reply([r.to_doc() for r in rows])
    elif not rows:
        render.line(f"no host aliases ({hosts_path()} does not define any)")
    else:
        render.show(render.hosts(rows))
    failed = any(
        r.check is not None and not (r.check.trainctl and r.check.compatible) for r in rows
    )
    return ExitCode.REMOTE if failed else ExitCode.OK
