"""`--all-hosts`: one verb on every host of hosts.toml at once, over the existing ssh path.

Each host is asked in a thread of its own (ssh is a process each; nothing here waits on
another host), so the table arrives as soon as the slowest host answers, and a host that
does not answer costs its ssh connect timeout at most. A host that cannot be asked is a
row of its own that says why; the others still show.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from trainctl.launcher.remote import Host, fetch_json, load_hosts
from trainctl.launcher.results.ops import HostAnswer
from trainctl.supervisor.errors import ConfigError


def _ask(host: Host, args: list[str]) -> HostAnswer:
    t0 = time.monotonic()
    doc, error = fetch_json(host, args)
    return HostAnswer(host.name, doc, error, round(time.monotonic() - t0, 3))


def over_hosts(args: list[str]) -> list[HostAnswer]:
    """``trainctl ARGS --json`` on every host alias, in parallel; in hosts.toml's order."""
    hosts = list(load_hosts().values())
    if not hosts:
        raise ConfigError(
            "--all-hosts: no hosts in hosts.toml (`trainctl hosts` says where it is read)"
        )
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(lambda h: _ask(h, args), hosts))
