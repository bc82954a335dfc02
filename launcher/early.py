"""The stop's request, and status's question, sent before the rest of trainctl is imported.

`trainctl stop NAME` of a job whose supervisor lives is, to the user, one thing: the
signal should land now. Importing what follows and renders the stop (the verb, the
records, the state's schema) takes several times as long as starting the interpreter, so
the console script hands the command line here first. For the plain shapes the fast path
serves (``[--home DIR] stop NAME [--json] [--grace SECONDS] [--order ORDER]
[--main-only]``) this module, on the standard library's C parts only, finds the job's
control socket, checks that the process serving it is this job's own supervisor (our
uid, ``python -m trainctl.supervisor --home HOME --name NAME``; both from
supervisor/model/layout.py, which imports only os), and sends the stop. The
verb then runs as always and, where it would send the same request, reads the answer to
this one (:func:`claim`). Anything unusual (a queued run of the name, a config that
decides the home, a value this module does not parse, no answering supervisor) sends
nothing here: the verb does it all, as before.

A live supervisor is the job's authority: it signals from its own roster, not from
state.json, so nothing here reads or trusts that file.

`trainctl status NAME [--json]` takes the same path for its one question to the
supervisor: ``{"op": "members"}``, the run's live processes as its roster holds them. The
supervisor answers while the CLI imports the status code; :func:`members_answer` hands the
reply line to `status`, which checks it (``reports.MembersReply``) and shows it instead of
reading each process of the job again. No answer in time, or no question sent (any other
shape of the command): `status` counts them itself, as before.
"""

from __future__ import annotations

import _socket  # the C module: `socket` itself imports enum and selectors (~4 ms)
import os
import sys

from trainctl.launcher import (
    durations,  # the one grammar of a duration (no import)
    options,  # the fast shapes' options, as click declares them (no import)
)
from trainctl.supervisor.model import (
    layout,  # plain strings: the job layout, spelt once
    wire,  # the requests' one encoder (no import)
)

_ORDERS = ("tree", "all", "main")
_SUN_PATH_MAX = 107
WAIT_S = 0.25  # how long the request waits for its answer before the verb is imported

# jdir -> (the open connection, what it asked: order, grace_s)
_pending: dict[str, tuple[_socket.socket, tuple[str | None, float | None]]] = {}
# jdir -> the connection that asked the supervisor for the members (status)
_asked: dict[str, _socket.socket] = {}
ANSWER_S = 0.5  # how long status waits for that answer before it counts the members itself


def send(argv: list[str]) -> None:
    """A plain stop's request, or a plain status's question, to the job's live supervisor."""
    rest = argv[2:] if argv[:1] == ["--home"] else argv
    verb = rest[0] if rest else None
    if verb == "stop":
        send_stop(argv)
    elif verb == "status":
        ask_members(argv)


def ask_members(argv: list[str]) -> None:
    """If ``argv`` is ``[--home DIR] status NAME [--json]`` of a job whose supervisor
    answers, ask it for the members now; `status` reads the answer (:func:`members_answer`)."""
    home_opt, rest = (
        (argv[1], argv[2:]) if argv[:1] == ["--home"] and len(argv) >= 2 else (None, argv)
    )
    if len(rest) not in (2, 3) or rest[0] != "status" or rest[2:] not in ([], ["--json"]):
        return
    if home_opt == "":
        return  # an empty --home is refused by the verb, never read as the default
    found = _job(home_opt, rest[1])
    if found is None:
        return
    jdir, sock = found
    try:
        sock.sendall(wire.request("members"))
    except OSError:
        sock.close()
        return
    _asked[jdir] = sock


def members_answer(jdir: str) -> bytes | None:
    """The supervisor's reply line to the members question sent for ``jdir``; None when
    none was sent or it did not come within ANSWER_S (then `status` counts them itself)."""
    sock = _asked.pop(jdir, None)
    if sock is None:
        return None
    buf = b""
    try:
        sock.settimeout(ANSWER_S)
        while not buf.endswith(b"\n") and len(buf) < 4096:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            buf += chunk
    except OSError:
        return None
    finally:
        sock.close()
    return buf if buf.endswith(b"\n") else None


def _job(home_opt: str | None, name: str) -> tuple[str, _socket.socket] | None:
    """The job directory and a connection to its own live supervisor, for a job the
    verb would find the same way; None for anything unusual (the verb decides it)."""
    if os.environ.get("TRAINCTL_HOST") or os.environ.get("TRAINCTL_CLIENT_VERSION"):
        return None  # --host through the environment, or the remote end (its version check)
    home = home_of(home_opt)
    if home is None or not layout.name_ok(name):
        return None
    jdir = layout.job_dir(home, name)
    sock_path, queued = layout.control_path(home, name), layout.queue_entry(home, name)
    if not _owned_dir(jdir) or os.path.lexists(queued):
        return None  # a queued run of this name: the verb deals with the queue first
    sock = _connect(sock_path, home, name)
    return None if sock is None else (jdir, sock)


def send_stop(argv: list[str]) -> None:
    """If ``argv`` is a plain stop of one job whose supervisor answers, send it now."""
    asked = _parse(argv)
    if asked is None:
        return
    home_opt, name, order, grace_s = asked
    found = _job(home_opt, name)
    if found is None:
        return
    jdir, sock = found
    fields: dict[str, wire.Scalar] = {"gpu_timeout_s": None}
    if order is not None:
        fields |= {"order": order, "main_only": order == "main"}
    if grace_s is not None:
        fields["grace_s"] = grace_s
    try:
        sock.sendall(wire.request("stop", **fields))
    except OSError:
        sock.close()
        return
    _pending[jdir] = (sock, (order, grace_s))
    _let_it_finish(sock, name)


def _let_it_finish(sock: _socket.socket, name: str) -> None:
    """Wait up to WAIT_S for the answer before importing anything: on a small machine the
    imports (~100 ms of CPU) would slow the stop they run beside. A stop that takes longer
    (a grace used for a checkpoint) is narrated by the verb from then on. Ctrl-C here is
    the verb's first Ctrl-C: the stop goes on in the supervisor, the command ends (130)."""
    try:
        sock.settimeout(WAIT_S)
        sock.recv(1, _socket.MSG_PEEK)  # the answer stays queued for the verb to read
    except OSError:
        pass  # not yet (or the supervisor went away): the verb finds out either way
    except KeyboardInterrupt:
        for jdir in [j for j, (s, _) in _pending.items() if s is sock]:
            del _pending[jdir]
        sock.close()
        sys.stderr.write(
            f"\ntrainctl: the stop continues in the background (`trainctl status {name}`)\n"
        )
        raise SystemExit(130) from None
    sock.settimeout(None)  # the verb sets its own while it waits for the answer


def sent() -> bool:
    """Whether a stop went out from here that nobody has read yet."""
    return bool(_pending)


def pending(jdir: str) -> bool:
    """Whether a stop of ``jdir`` went out from here and is not read yet."""
    return jdir in _pending


def claim(jdir: str, order: str | None, grace_s: float | None) -> _socket.socket | None:
    """The connection whose stop already went out for ``jdir``, if it asked the same."""
    entry = _pending.pop(jdir, None)
    if entry is None:
        return None
    sock, asked = entry
    if asked == (order, grace_s):
        return sock
    sock.close()  # not what the verb asks (it resolved something differently): it asks anew
    return None


def unclaimed() -> list[tuple[str, _socket.socket]]:
    """The stops sent here that the verb never came to read (it failed before it did)."""
    out = [(jdir, sock) for jdir, (sock, _) in _pending.items()]
    _pending.clear()
    return out


def _parse(argv: list[str]) -> tuple[str | None, str, str | None, float | None] | None:
    line = options.parse_fast(argv, ("stop",))  # the fast path's one parser, click's table
    if line is None:
        return None
    home, name, given = line.home, line.name, line.given
    order = given.get("order")
    if order is not None and order not in _ORDERS:
        return None
    order = str(order) if order is not None else None
    grace_s: float | None = None
    if "grace" in given and (grace_s := _seconds(str(given["grace"]))) is None:
        return None
    if given.get("main_only"):
        if order not in (None, "main"):
            return None  # a contradiction: the verb says so
        order = "main"
    return home, name, order, grace_s


def _seconds(text: str) -> float | None:
    """A grace the verb would take as it is (the one grammar, durations.py), positive and
    within a year; else None (the verb reads it, and says what is wrong)."""
    value = durations.seconds(text)
    return value if value is not None and 0 < value <= _YEAR_S else None


_YEAR_S = 365 * 24 * 3600.0  # inputs.MAX_DURATION_S: beyond it, the verb's own refusal


def home_of(home_opt: str | None) -> str | None:
    """The home as `resolve_home` makes it; None where the config file decides it."""
    chosen = home_opt or os.environ.get("TRAINCTL_HOME")
    if not chosen:
        config = os.environ.get("TRAINCTL_CONFIG") or (
            (os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"))
            + "/trainctl/config.toml"
        )
        if os.path.lexists(config):
            return None  # its state.home may name another home: the verb reads it
        chosen = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        chosen += "/trainctl"
    path = os.path.expanduser(chosen)
    path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    # as pathlib writes it (no '.', no empty parts; '..' kept): the supervisor's --home
    path = "/" + "/".join(part for part in path.split("/") if part not in ("", "."))
    return layout.followed_home(path)


def _owned_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_mode & 0o170000) == 0o040000 and st.st_uid == os.geteuid()


def _connect(path: str, home: str, name: str) -> _socket.socket | None:
    """A connection to ``path`` served by this job's own supervisor; else None."""
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(path)
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
        pid = int.from_bytes(cred[0:4], sys.byteorder)
        uid = int.from_bytes(cred[4:8], sys.byteorder)
        if uid != os.geteuid() or not _is_its_supervisor(pid, home, name):
            sock.close()
            return None
        sock.settimeout(None)
    except OSError:
        sock.close()
        return None
    return sock


def _is_its_supervisor(pid: int, home: str, name: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    want = [os.fsencode(a) for a in layout.supervisor_args(home, name)]
    return any(argv[i : i + len(want)] == want for i in range(len(argv)))
