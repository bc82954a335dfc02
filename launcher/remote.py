"""`--host HOST`: run the same verb on another machine through the user's OpenSSH client.

The system ``ssh`` is used on purpose: ~/.ssh/config, the agent, ProxyJump and known_hosts
all apply. Every argument is quoted for the remote shell (job argv and names can hold
spaces, quotes or ``$``), and a host alias may add a prefix that enters a container
(``pct exec 200 --``, ``docker exec -i NAME``, ``lxc-attach -n NAME --``).

On the remote side a tiny ``sh`` wrapper announces itself on stderr before it execs
trainctl, so a failure is classified exactly: no announcement and ssh's 255 means ssh
itself failed; no announcement otherwise means the container prefix failed; an announced
"missing" means trainctl is not on the remote PATH. Output streams straight through and
the remote exit code becomes ours.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import IO, Any

from trainctl.supervisor.errors import ConfigError, RemoteError
from trainctl.supervisor.records import JsonObject, asdict, field, record

from . import __version__
from .globalopts import global_options_end

CONNECTED = "__trainctl_ssh_connected__"  # printed by the remote login shell itself
READY = "__trainctl_remote_ready__"
MISSING = "__trainctl_remote_missing__"
# $0 = the remote trainctl; prints READY, checks it exists, then becomes it.
WRAPPER = (
    f'echo {READY} >&2; command -v "$0" >/dev/null 2>&1 || {{ echo {MISSING} >&2; exit 127; }}; '
    'TRAINCTL_CLIENT_VERSION="$TCV" exec "$0" "$@"'
)
WRAPPER_TTY = (
    'command -v "$0" >/dev/null 2>&1 || { echo "trainctl: not found on this host" >&2; '
    'exit 127; }; TRAINCTL_CLIENT_VERSION="$TCV" exec "$0" "$@"'
)
SSH_ERRORS = (
    ("Permission denied", "authentication refused"),
    ("Connection refused", "connection refused"),
    ("timed out", "connection timed out"),
    ("Could not resolve hostname", "unknown host"),
    ("No route to host", "no route to host"),
    ("Host key verification failed", "host key verification failed"),
    ("Connection closed", "connection closed"),
)


@record(frozen=True)
class Host:
    """A remote host: an alias from hosts.toml, or a bare ssh destination."""

    name: str
    target: str
    port: int | None = None
    identity: str | None = None
    prefix: tuple[str, ...] = ()
    trainctl: str = "trainctl"
    home: str | None = None
    ssh_config: str | None = None
    connect_timeout_s: int = 10
    ssh_options: tuple[str, ...] = field(default_factory=tuple)


def hosts_path() -> Path:
    """Return the hosts file: $TRAINCTL_HOSTS, else hosts.toml in the config dir."""
    if os.environ.get("TRAINCTL_HOSTS"):
        return Path(os.environ["TRAINCTL_HOSTS"])
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(xdg) / "trainctl" / "hosts.toml"


_HOST_KEYS: dict[str, type | tuple[type, ...]] = {
    "target": str,
    "port": int,
    "identity": str,
    "prefix": (str, list),
    "trainctl": str,
    "home": str,
    "ssh_config": str,
    "connect_timeout_s": int,
    "ssh_options": list,
}


def load_hosts() -> dict[str, Host]:
    """Read and validate hosts.toml (missing file: no aliases)."""

    path = hosts_path()
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    out = {}
    for name, entry in doc.get("hosts", {}).items():
        if not isinstance(entry, dict) or "target" not in entry:
            raise ConfigError(f"{path}: [hosts.{name}] needs a target (user@host or ssh alias)")
        for key, value in entry.items():
            if key not in _HOST_KEYS:
                raise ConfigError(f"{path}: unknown key hosts.{name}.{key}")
            if not isinstance(value, _HOST_KEYS[key]):
                raise ConfigError(f"{path}: hosts.{name}.{key} has the wrong type")
        prefix = entry.get("prefix", ())
        out[name] = Host(
            name=name,
            target=entry["target"],
            port=entry.get("port"),
            identity=entry.get("identity"),
            prefix=tuple(shlex.split(prefix) if isinstance(prefix, str) else prefix),
            trainctl=entry.get("trainctl", "trainctl"),
            home=entry.get("home"),
            ssh_config=entry.get("ssh_config"),
            connect_timeout_s=entry.get("connect_timeout_s", 10),
            ssh_options=tuple(entry.get("ssh_options", ())),
        )
    extra = set(doc) - {"hosts"}
    if extra:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(extra))}")
    return out


def resolve_host(name: str) -> Host:
    """Return the alias ``name``, or a Host for the bare ssh destination ``name``."""
    if not name or name.startswith("-"):
        raise ConfigError(f"--host: invalid host {name!r}")
    return load_hosts().get(name) or Host(name=name, target=name)


def ssh_argv(host: Host, remote_args: list[str], *, tty: bool = False) -> list[str]:
    """Build the ssh command line that runs ``trainctl REMOTE_ARGS`` on the host.

    ``tty``: a full-screen verb (`top`) gets a remote terminal (``ssh -t``); its stderr is
    then part of the screen, so the wrapper's markers are left out.
    """
    argv = [
        "ssh",
        "-t" if tty else "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={host.connect_timeout_s}",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=3",
    ]
    if host.ssh_config:
        argv += ["-F", os.path.expanduser(host.ssh_config)]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.identity:
        argv += ["-i", os.path.expanduser(host.identity), "-o", "IdentitiesOnly=yes"]
    argv += list(host.ssh_options)
    wrapper = WRAPPER_TTY if tty else WRAPPER
    inner = [*host.prefix, "env", f"TCV={__version__}", "sh", "-c", wrapper, host.trainctl]
    globals_given = remote_args[: global_options_end(remote_args)]
    if host.home and not any(a == "--home" or a.startswith("--home=") for a in globals_given):
        inner += ["--home", host.home]
    # ssh joins its arguments with spaces for the remote shell: quote each one ourselves.
    # The login shell first says it is there, so that an exit 255 after that comes from
    # the container prefix, not from ssh.
    hello = "" if tty else f"echo {CONNECTED} >&2; "
    return [*argv, "--", host.target, hello + shlex.join(inner + remote_args)]


@record()
class _Stderr:
    """Copies the remote stderr through, minus the wrapper's markers, remembering them."""

    connected: bool = False  # the remote login shell ran: ssh itself worked
    ready: bool = False
    missing: bool = False
    before: list[str] = field(default_factory=list)  # what came before READY (ssh/prefix)
    after: list[str] = field(default_factory=list)  # ... and after it (captured calls only)

    def pump(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            if line.strip() == CONNECTED:
                self.connected = True
            elif line.strip() == READY:
                self.ready = True
            elif line.strip() == MISSING:
                self.missing = True
            elif self.ready:
                sys.stderr.write(line)
                sys.stderr.flush()
            else:
                self.before.append(line.rstrip())


def run_remote(host_name: str, remote_args: list[str]) -> int:
    """Run ``trainctl REMOTE_ARGS`` on the host; stream its output; return its exit code."""
    host = resolve_host(host_name)
    end = global_options_end(remote_args)
    verb = remote_args[end] if end < len(remote_args) else ""
    if verb == "web":
        return _web_tunnel(host, remote_args[end + 1 :])
    full_screen = verb == "attach" or (verb == "top" and "--once" not in remote_args[end:])
    if full_screen and sys.stdin.isatty():
        return _run_tty(host, remote_args)
    argv = ssh_argv(host, remote_args)
    err = _Stderr()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise RemoteError("ssh is not installed (install openssh-client)") from None
    pump = threading.Thread(target=err.pump, args=(proc.stderr,), daemon=True)
    pump.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        # Close the channel (ssh may or may not have had the SIGINT too: it is our child,
        # so terminating it is ours to do). The remote follower then sees its stdout gone
        # and exits, so nothing is left running there.
        proc.terminate()
        proc.wait()
        pump.join(2)
        sys.stderr.write(f"\ntrainctl: detached from {host.name}\n")
        return 130
    pump.join(5)
    return _classify(host, code, err)


def _web_tunnel(host: Host, web_args: list[str]) -> int:
    """`--host H web`: a page on H is reached through an ssh tunnel, which this prints."""
    port = "8765"
    for i, a in enumerate(web_args):
        if a == "--port" and i + 1 < len(web_args):
            port = web_args[i + 1]
        elif a.startswith("--port="):
            port = a.split("=", 1)[1]
    if not port.isdigit() or port == "0":
        raise ConfigError("--host ... web: give a fixed --port (the tunnel forwards that one)")
    argv = ["ssh", "-L", f"{port}:127.0.0.1:{port}"]
    if host.ssh_config:
        argv += ["-F", host.ssh_config]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.identity:
        argv += ["-i", host.identity]
    remote = [*host.prefix, host.trainctl, "web", "--port", port, *_without_port(web_args)]
    sys.stdout.write(shlex.join([*argv, host.target, shlex.join(remote)]) + "\n")
    sys.stdout.write(f"then open the URL it prints here (port {port} is forwarded)\n")
    return 0


def _without_port(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--port":
            skip = True
        elif not a.startswith("--port="):
            out.append(a)
    return out


def _run_tty(host: Host, remote_args: list[str]) -> int:
    """A full-screen verb: ssh -t, with the user's terminal as its stdin and stdout."""
    try:
        code = subprocess.call(ssh_argv(host, remote_args, tty=True))
    except FileNotFoundError:
        raise RemoteError("ssh is not installed (install openssh-client)") from None
    if code == 255:
        raise RemoteError(f"{host.name} unreachable, or its session failed (ssh exit 255)")
    if code == 127:
        raise RemoteError(f"trainctl not found on {host.name} (or its container prefix)")
    return code


def _classify(host: Host, code: int, err: _Stderr) -> int:
    if err.ready and not err.missing:
        return code
    detail = "; ".join(line for line in err.before if line)[-300:]
    if err.missing:
        raise RemoteError(
            f"trainctl not found on {host.name} (looked for {host.trainctl!r} on the remote "
            'PATH); install it there (pip install trainctl) or set trainctl = "/path" for '
            "this host in hosts.toml"
        )
    if code == 255 and not err.connected:
        why = next((w for needle, w in SSH_ERRORS if needle in detail), "ssh failed")
        raise RemoteError(f"{host.name} unreachable: {why} ({detail or 'no detail'})")
    if host.prefix:
        raise RemoteError(
            f"container prefix {shlex.join(host.prefix)!r} failed on "
            f"{host.name} (exit {code}): {detail or 'no output'}"
        )
    raise RemoteError(f"remote shell on {host.name} failed (exit {code}): {detail or 'no output'}")


@record(frozen=True)
class HostCheck:
    """What `trainctl hosts --check` found on one host."""

    reachable: bool
    trainctl: bool = False  # found on the remote PATH
    version: str | None = None
    compatible: bool = False
    error: str | None = None


@record(frozen=True)
class HostRow:
    """One alias of hosts.toml, and its check when one was asked for."""

    host: Host
    check: HostCheck | None = None

    def to_doc(self) -> JsonObject:
        """The JSON form: the alias's keys, then the check's (its `trainctl`: found or not)."""
        h = self.host
        doc: JsonObject = {
            "name": h.name,
            "target": h.target,
            "port": h.port,
            "prefix": " ".join(h.prefix),
            "trainctl": h.trainctl,
            "home": h.home,
        }
        if self.check is not None:  # `trainctl` now says whether it was found there
            doc.update(asdict(self.check))
        return doc


def _call(host: Host, remote_args: list[str], timeout_s: float) -> tuple[str, _Stderr, int]:
    """Run ``trainctl REMOTE_ARGS`` on ``host``, captured: (stdout, what its stderr said,
    exit code); TimeoutExpired past ``timeout_s``."""
    p = subprocess.run(
        ssh_argv(host, remote_args),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [line for line in p.stderr.splitlines() if line != CONNECTED]
    err = _Stderr(connected=len(lines) != len(p.stderr.splitlines()))
    err.ready, err.missing = READY in lines, MISSING in lines
    err.before = lines[: lines.index(READY)] if err.ready else lines
    if err.ready:
        err.after = lines[lines.index(READY) + 1 :]
    return p.stdout, err, p.returncode


def check_host(host: Host) -> HostCheck:
    """Connect to ``host``: reachable, trainctl found there, its version compatible."""
    try:
        out, err, code = _call(host, ["--version"], host.connect_timeout_s + 20)
    except subprocess.TimeoutExpired:
        return HostCheck(reachable=False, error="timed out")
    try:
        _classify(host, code, err)
    except RemoteError as e:
        return HostCheck(reachable=err.ready or code != 255, error=str(e))
    version = out.strip().rsplit(" ", 1)[-1] if code == 0 else None
    return HostCheck(True, trainctl=True, version=version, compatible=compatible(version or ""))


def fetch_json(host: Host, remote_args: list[str]) -> tuple[Any, str | None]:
    """Run ``trainctl REMOTE_ARGS --json`` on ``host``: (its document, None), or (None,
    why not in one line: unreachable, auth, no trainctl, version, its own error)."""
    limit = host.connect_timeout_s + 60
    try:
        out, err, code = _call(host, [*remote_args, "--json"], limit)
    except subprocess.TimeoutExpired:
        return None, f"{host.name}: no answer within {limit:g} s"
    try:
        _classify(host, code, err)
    except RemoteError as e:
        return None, str(e)
    try:
        return json.loads(out), None
    except ValueError:
        said = next((x for x in reversed(err.after) if x.strip()), f"exit {code}")
        return None, f"{host.name}: {said.removeprefix('trainctl: error: ')}"


def compatible(remote_version: str) -> bool:
    """Same major.minor as this client."""
    return remote_version.split(".")[:2] == __version__.split(".")[:2]


def check_client_version() -> None:
    """Refuse a call from a client whose major.minor differs from ours (remote side)."""
    client = os.environ.get("TRAINCTL_CLIENT_VERSION")
    if client and not compatible(client):
        raise RemoteError(
            f"incompatible trainctl versions: client {client}, this host "
            f"{__version__}; install the same version on both"
        )


def split_host(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take ``--host HOST`` / ``--host=HOST`` out of trainctl's global options.

    Only the options before the verb count (see launcher/globalopts.py). Falls back to
    $TRAINCTL_HOST; returns (host or None, the remaining argv).
    """
    end = global_options_end(argv)
    out: list[str] = []
    host = None
    i = 0
    while i < end:
        arg = argv[i]
        if arg == "--host":
            if i + 1 >= len(argv):
                raise ConfigError("--host needs a value")
            host, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--host="):
            host, i = arg.split("=", 1)[1], i + 1
            continue
        out.append(arg)
        i += 1
    return host or os.environ.get("TRAINCTL_HOST") or None, out + argv[end:]
