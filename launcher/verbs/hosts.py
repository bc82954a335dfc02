"""`trainctl hosts`: the aliases of hosts.toml, and whether each is reachable."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.remote import check_host, hosts_path, load_hosts

from . import Invocation


def run(inv: Invocation, *, check: bool = False, as_json: bool = False) -> int:
    """List the aliases; --check connects to each (exit 5 when one fails)."""
    del inv  # hosts.toml is the client's own, not a home's
    rows = []
    for h in load_hosts().values():
        row: dict[str, object] = {
            "name": h.name,
            "target": h.target,
            "port": h.port,
            "prefix": " ".join(h.prefix),
            "trainctl": h.trainctl,
            "home": h.home,
        }
        if check:
            row.update(check_host(h))
        rows.append(row)
    if as_json:
        render.emit_json(rows)
    elif not rows:
        render.line(f"no host aliases ({hosts_path()} does not define any)")
    else:
        render.hosts(rows)
    failed = check and any(not r.get("trainctl") or not r.get("compatible") for r in rows)
    return ExitCode.REMOTE if failed else ExitCode.OK
