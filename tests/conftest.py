"""Real-process test harness.

Every process a test creates carries ``TCTEST_MARK=<uuid>`` in its environment (the
trainctl CLI records it in the job's environment, so supervisors and job processes carry
it too). After each test the ``harness`` fixture finds survivors *by that marker, verified
by pid + start time*, SIGKILLs them through a pidfd and fails the test if any were not
bystanders. Nothing here ever signals a process it did not start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainctl.supervisor.model.events import read_events

TREES = Path(__file__).parent / "trees"
TRAINCTL = [sys.executable, "-m", "trainctl.launcher"]
HELD_TICK_S = 0.1  # the supervisor's snapshot interval in mode_harness's `held` mode


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw.rpartition(b")")[2].split()
    return fields[0].decode(), int(fields[19])


def marked(mark: str) -> dict[int, tuple[int, bool]]:
    """Return {pid: (start_ticks, is_bystander)} of live processes carrying the mark."""
    needle = f"TCTEST_MARK={mark}".encode()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in env:
            st = _stat(int(name))
            if st and st[0] != "Z":
                out[int(name)] = (st[1], b"TCTEST_BYSTANDER=1" in env)
    return out


def kill_verified(pid: int, start_ticks: int) -> None:
    """SIGKILL (pid, start_ticks) through a pidfd, only if it is still that process."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        st = _stat(pid)
        if st and st[1] == start_ticks:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def alive(pid: int, start_ticks: int) -> bool:
    """Tell whether (pid, start_ticks) is running (zombies count as gone)."""
    st = _stat(pid)
    return st is not None and st[1] == start_ticks and st[0] not in ("Z", "X")


def wait_for(pred, timeout_s: float = 20.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    """Poll ``pred`` until true; fail after a generous deadline (catches hangs, not speed)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Result:
    """A finished CLI invocation."""

    rc: int
    out: str
    err: str

    def json(self) -> object:
        """Parse stdout as JSON."""
        return json.loads(self.out)


@dataclass
class Harness:
    """Runs trainctl and tree programs for one test, in an isolated TRAINCTL_HOME."""

    tmp: Path
    mark: str
    env: dict[str, str]
    bystanders: list[subprocess.Popen[bytes]] = field(default_factory=list)
    settle_s: float = 0.0  # after a start, let the supervisor tick this long (see mode_harness)

    @property
    def home(self) -> Path:
        """The test's TRAINCTL_HOME."""
        return Path(self.env["TRAINCTL_HOME"])

    def tc(
        self,
        *args: str,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        check: bool | None = None,
    ) -> Result:
        """Run the trainctl CLI; return rc/stdout/stderr."""
        p = subprocess.run(
            [*TRAINCTL, *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        res = Result(p.returncode, p.stdout, p.stderr)
        if check:
            assert res.rc == 0, f"trainctl {' '.join(args)} -> {res.rc}\n{res.out}\n{res.err}"
        assert "Traceback" not in p.stderr, p.stderr
        return res

    def ready_file(self, name: str) -> Path:
        """A path a tree creates when it is fully up."""
        return self.tmp / f"{name}.ready"

    def start_tree(
        self, name: str, tree: str, *args: str, grace: float = 2.0, extra: tuple[str, ...] = ()
    ) -> Result:
        """Start tests/trees/<tree> as job ``name`` and wait until the whole tree is up."""
        ready = self.ready_file(name)
        res = self.tc(
            "start",
            "--name",
            name,
            "--grace",
            str(grace),
            "--cwd",
            str(self.tmp),
            "--env",
            f"TREE_READY={ready}",
            *extra,
            "--",
            sys.executable,
            str(TREES / tree),
            *args,
            check=True,
        )
        wait_for(ready.exists, 60, f"tree {tree} to be ready")
        time.sleep(self.settle_s)
        return res

    def bystander(self, tree: str, *args: str) -> subprocess.Popen[bytes]:
        """Start the very same command line outside trainctl (it must survive every stop)."""
        ready = self.tmp / f"bystander-{len(self.bystanders)}.ready"
        env = {**self.env, "TREE_READY": str(ready), "TCTEST_BYSTANDER": "1"}
        p = subprocess.Popen(
            [sys.executable, str(TREES / tree), *args],
            env=env,
            cwd=self.tmp,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.bystanders.append(p)
        wait_for(ready.exists, 60, "bystander to be ready")
        return p

    def state(self, name: str) -> dict:  # type: ignore[type-arg]
        """Read a job's state.json."""
        return json.loads((self.home / "jobs" / name / "state.json").read_text())

    def events(self, name: str, kind: str | None = None) -> list[dict]:  # type: ignore[type-arg]
        """A job's events.jsonl (of one ``kind``), through trainctl's one reader."""
        return [e for e in read_events(self.home / "jobs" / name) if kind in (None, e["event"])]

    def job_pids(self, name: str) -> dict[int, int]:
        """Live processes of job ``name`` found independently via its marker: {pid: start}."""
        needle = f"TRAINCTL_JOB={self.state(name)['marker']}".encode()
        out = {}
        for pid, (start, _) in marked(self.mark).items():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if needle in env:
                out[pid] = start
        return out

    def assert_bystanders_alive(self) -> None:
        """Every bystander (and its own children) is still running."""
        for p in self.bystanders:
            assert p.poll() is None, f"bystander {p.pid} was killed"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """An isolated home + marker; afterwards, no marked survivor may remain."""
    mark = uuid.uuid4().hex
    # COLUMNS and LINES too: a test that wants a width says so (pytest-xdist's workers
    # inherit a COLUMNS the main process never had, and every table would be cut to it)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRAINCTL_") and k not in ("COLUMNS", "LINES")
    }
    env.update(
        TRAINCTL_HOME=str(tmp_path / "home"),
        TCTEST_MARK=mark,
        TRAINCTL_CONFIG=str(tmp_path / "config.toml"),
        # start returns at exec, as before its first-look watch (tests/cli/test_start_watch.py
        # tests the watch): 1.5 s on each of the suite's hundreds of starts
        TRAINCTL_START_WATCH="0",
    )
    (tmp_path / "config.toml").write_text("")  # named, so it must exist: tests write to it
    h = Harness(tmp=tmp_path, mark=mark, env=env)
    yield h
    # A process that has just released its locks may still be finishing its exit: give
    # the marked set a moment to drain before calling anything a leak.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(not b for _, b in marked(mark).values()):
        time.sleep(0.02)
    leaked: dict[int, bytes] = {}
    # Kill until nothing marked is left: a bystander that keeps forking (trees/forker.py)
    # forks again between one enumeration and its kills, and those children used to
    # outlive the test run (asleep for 600 s).
    deadline = time.monotonic() + 10
    while (found := marked(mark)) and time.monotonic() < deadline:
        for pid, (start, is_bystander) in found.items():
            if not is_bystander and pid not in leaked:
                with contextlib.suppress(OSError):
                    leaked[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()[:120]
            kill_verified(pid, start)
        time.sleep(0.02)
    for p in h.bystanders:
        p.wait(timeout=10)
    if leaked:
        pytest.fail(f"test leaked processes (now SIGKILLed): {sorted(leaked.items())}")


@pytest.fixture
def here(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The harness's environment in this process too, for tests that call
    launcher/early.py in-process (it reads os.environ); the stops it sent and nobody
    claimed are closed afterwards."""
    from trainctl.launcher import early  # noqa: PLC0415  (only the tests that use it)

    for key in ("TRAINCTL_HOST", "TRAINCTL_CLIENT_VERSION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINCTL_HOME", str(harness.home))
    yield harness
    for _jdir, sock in early.unclaimed():
        sock.close()


@pytest.fixture(params=["held", "signals"])
def mode_harness(request: pytest.FixtureRequest, harness: Harness) -> Harness:
    """The harness, once with cgroup v2 placement (where available) and once without.

    ``held``: cgroup mode, and every job runs a few supervisor ticks before the test goes
    on, so that a stop starts from the members the supervisor holds by pidfd (its roster,
    the path of every stop of a job that ran a while); the many tests on the plain
    ``harness`` stop right after start, and cover the stop that collects its members.
    """
    if request.param == "signals":
        Path(harness.env["TRAINCTL_CONFIG"]).write_text("[start]\ncgroup = false\n")
    elif not _cgroup_writable():
        pytest.skip("cgroup v2 is not writable on this machine")
    else:
        Path(harness.env["TRAINCTL_CONFIG"]).write_text(
            f"[supervisor]\nsnapshot_interval_s = {HELD_TICK_S}\n"
        )
        harness.settle_s = 4 * HELD_TICK_S
    return harness


def _cgroup_writable() -> bool:
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from trainctl.supervisor.linux import cgroup  # noqa: PLC0415

    path = cgroup.create_job_cgroup(f"probe-{uuid.uuid4().hex[:8]}")
    if path is None:
        return False
    cgroup.remove(path)
    return True


V1_FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def v1_freezer() -> Iterator[Path]:
    """A cgroup-v1 freezer group: its frozen tasks cannot act on SIGKILL until thawed."""
    if not (V1_FREEZER / "cgroup.procs").exists() or not os.access(V1_FREEZER, os.W_OK):
        pytest.skip("no writable cgroup v1 freezer on this machine")
    path = V1_FREEZER / f"tctest-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            (path / "freezer.state").write_text("THAWED")
        wait_for(lambda: not (path / "cgroup.procs").read_text().strip(), 10, "thawed exit")
        path.rmdir()
