"""systemd hosts, on a booted systemd container: jobs survive logout, stop leaves no unit.

The bed (built here, cached under /var/tmp/trainctl-bed): a Debian 12 tree made by
debootstrap, booted with systemd-nspawn from a cgroup of its own, logind set to
KillUserProcesses=yes with KillExcludeUsers=nobody (so root is killed at logout too),
sshd reached over a veth pair, and this checkout installed with `pip install --target`
and bind-mounted read-only. Logins go through ssh, because only a real login gets a
session scope. Everything skips, with the reason, where the bed cannot be built or booted.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Harness

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("TRAINCTL_BED_CACHE", "/var/tmp/trainctl-bed"))
PACKAGES = "systemd,systemd-sysv,dbus,libpam-systemd,openssh-server,python3,procps,iproute2"
ROOT_DIR = Path(__file__).resolve().parents[2]
TC = "python3 -m trainctl.launcher"


@dataclass
class Bed:
    """A booted systemd container and the way in."""

    ip: str
    key: Path
    group: Path  # the host cgroup holding nspawn and the whole container
    out: Path  # a host folder the container sees at /mnt/out (outlives a poweroff)
    code: Path  # another one, at /mnt/code: a job's cwd on a mount of its own
    nspawn: subprocess.Popen[bytes]

    def ssh(
        self, cmd: str, user: str = "root", timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Log in, run ``cmd``, log out (a real login: a new session scope each time)."""
        argv = [
            "ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=5", f"{user}@{self.ip}", cmd,
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("the systemd bed needs root (debootstrap, nspawn, veth)")
    for tool in ("debootstrap", "systemd-nspawn", "ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install debootstrap systemd-container)")
    if not Path("/sys/fs/cgroup").exists():
        pytest.skip("no cgroup file system")


def _rootfs() -> Path:
    """The Debian tree, built once per machine (~60-90 s) and kept under CACHE."""
    root = CACHE / "root"
    if (CACHE / "built").exists():
        return root
    shutil.rmtree(CACHE, ignore_errors=True)
    CACHE.mkdir(parents=True)
    done = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(root)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"debootstrap failed (no Debian mirror?): {done.stderr.strip()[-200:]}")
    (CACHE / "built").touch()
    return root


def _prepare(root: Path, key: Path, py: Path) -> None:
    """Settings of the tree itself (the boot is volatile: nothing else persists)."""
    logind = root / "etc/systemd/logind.conf.d"
    logind.mkdir(parents=True, exist_ok=True)
    (logind / "trainctl-test.conf").write_text(
        "[Login]\nKillUserProcesses=yes\nKillExcludeUsers=nobody\n"
    )
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    (root / "etc/environment").write_text(f"PYTHONPATH={py}\n")


def _own_cgroup() -> Path:
    mount = next(
        Path(line.split()[4])
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.partition(" - ")[2].startswith("cgroup2 ")
    )
    own = next(
        line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line[:3] == "0::"
    )
    return mount / own.lstrip("/")


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    _skip_unless_possible()
    root = _rootfs()
    tmp = tmp_path_factory.mktemp("bed")
    key = tmp / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    py = tmp / "py"
    # Built from a copy: a build in the checkout writes its build/, where the editable
    # install the other tests run from lives (they lost modules mid-run once).
    src = tmp / "src"
    junk = (".git", ".venv", "build", "*.egg-info", "*_cache", "__pycache__", "docs", "tests")
    shutil.copytree(ROOT_DIR, src, ignore=shutil.ignore_patterns(*junk))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(py), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    _prepare(root, key, Path("/opt/trainctl"))
    group = _own_cgroup() / f"tcbed-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    console = tmp / "console.log"
    out = tmp / "out"
    out.mkdir()
    code = tmp / "code"
    code.mkdir()
    log = console.open("w")
    boot = (
        f"echo $$ > {group}/cgroup.procs && SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec systemd-nspawn"
        f" -q -D {root} --volatile=overlay -b --register=no --keep-unit --private-network"
        f" --bind-ro={py}:/opt/trainctl --bind={out}:/mnt/out --bind={code}:/mnt/code"
    )
    nspawn = subprocess.Popen(
        ["sh", "-c", boot], stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    host_if = f"tcb{uuid.uuid4().hex[:6]}"
    subnet = f"10.{random.randint(64, 127)}.{random.randint(0, 255)}"  # noqa: S311
    try:
        init = _wait_init(nspawn, console)
        _veth(host_if, init, subnet)
        b = Bed(ip=f"{subnet}.2", key=key, group=group, out=out, code=code, nspawn=nspawn)
        _wait_running(b, console)
        yield b
    finally:
        (group / "cgroup.kill").write_text("1")  # nspawn and every process of the container
        nspawn.wait(30)
        log.close()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        _remove_tree(group)


def _remove_tree(group: Path) -> None:
    """rmdir the container's cgroups (its systemd made a whole tree), deepest first."""
    for _ in range(100):
        dirs = sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, group]:
            with contextlib.suppress(OSError):
                d.rmdir()
        if not group.exists():
            return
        time.sleep(0.05)


def _wait_init(nspawn: subprocess.Popen[bytes], console: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if nspawn.poll() is not None:
            pytest.skip(f"systemd-nspawn cannot boot here: {console.read_text()[-300:]}")
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if int(fields[1]) != nspawn.pid:
                continue
            if Path(f"/proc/{name}/comm").read_text().strip() == "systemd":
                return int(name)
        time.sleep(0.1)
    pytest.skip("the container's systemd never started")


def _veth(host_if: str, init: int, subnet: str) -> None:
    inner = f"{host_if}c"
    for cmd in (
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", inner],
        ["ip", "link", "set", inner, "netns", str(init)],
        ["ip", "addr", "add", f"{subnet}.1/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["nsenter", "-t", str(init), "-n", "ip", "addr", "add", f"{subnet}.2/30", "dev", inner],
        ["nsenter", "-t", str(init), "-n", "ip", "link", "set", inner, "up"],
        ["nsenter", "-t", str(init), "-n", "ip", "link", "set", "lo", "up"],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot wire the container's network: {' '.join(cmd)}: {done.stderr}")


def _wait_running(b: Bed, console: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        res = b.ssh("systemctl is-system-running --wait", timeout=30)
        if res.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(0.5)
    pytest.skip(f"the container never came up for ssh: {console.read_text()[-300:]}")


def _job_cgroup(b: Bed, name: str, home: str = "/root/.local/state/trainctl") -> str:
    pid = b.ssh(
        f"python3 -c \"import json; print(json.load(open('{home}/jobs/{name}/state.json'))"
        "['main']['pid'])\""
    ).stdout.strip()
    return b.ssh(f"cat /proc/{pid}/cgroup").stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------- the tests


def test_a_job_started_from_a_login_survives_logout_and_stops_without_a_trace(bed: Bed) -> None:
    start = bed.ssh(f"{TC} start --name train --grace 2 -- sleep 600")
    assert start.returncode == 0, start.stderr
    assert "unit: trainctl-train-r1-" in start.stdout
    time.sleep(3)  # logind has torn the login's session scope down by now
    status = bed.ssh(f"{TC} status train --json")
    assert status.returncode == 0, (status.stdout, status.stderr)
    assert '"state": "running"' in status.stdout
    assert "unit trainctl-train-r1-" in bed.ssh(f"{TC} ps train").stdout
    where = _job_cgroup(bed, "train")
    assert "/trainctl.slice/trainctl-train-r1-" in where
    assert "session-" not in where
    doctor = bed.ssh(f"{TC} doctor")
    assert "KillUserProcesses=yes" in doctor.stdout
    assert "Delegate=yes" in doctor.stdout
    stop = bed.ssh(f"{TC} stop train --json")  # from a new login
    assert stop.returncode == 0, stop.stderr
    left = bed.ssh("pgrep -x sleep; systemctl list-units 'trainctl-train*' --no-legend")
    assert left.stdout.strip() == ""


def test_without_the_scope_the_same_job_dies_at_logout(bed: Bed) -> None:
    """The control: what happened before trainctl put jobs in their own scope."""
    cfg = "printf '[start]\\nsystemd = false\\n' > /tmp/nosd.toml"
    res = bed.ssh(f"{cfg} && TRAINCTL_CONFIG=/tmp/nosd.toml {TC} start --name plain -- sleep 600")
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and bed.ssh("pgrep -x sleep").stdout.strip():
        time.sleep(0.5)
    assert bed.ssh("pgrep -x sleep").stdout.strip() == ""
    bed.ssh(f"{TC} rm plain")


def _alice(b: Bed) -> None:
    add = b.ssh(
        "id alice || (useradd -m -s /bin/bash alice && mkdir -p ~alice/.ssh && "
        "cp /root/.ssh/authorized_keys ~alice/.ssh/ && chown -R alice: ~alice/.ssh)"
    )
    assert add.returncode == 0, add.stderr


def test_a_user_without_linger_is_warned_and_linger_keeps_the_job(bed: Bed) -> None:
    _alice(bed)
    res = bed.ssh(f"{TC} start --name a -- sleep 600", user="alice")
    assert res.returncode == 0, res.stderr
    assert "loginctl enable-linger alice" in res.stderr
    assert bed.ssh(f"{TC} doctor", user="alice").returncode == 1  # linger: FIX
    assert bed.ssh("loginctl enable-linger alice").returncode == 0
    res = bed.ssh(f"{TC} start --name b -- sleep 600", user="alice")
    assert res.returncode == 0, res.stderr
    assert "linger" not in res.stderr
    time.sleep(3)
    status = bed.ssh(f"{TC} status b", user="alice")
    assert status.returncode == 0, status.stdout
    assert bed.ssh(f"{TC} stop b", user="alice").returncode == 0
    bed.ssh("loginctl disable-linger alice")


# A checkpoint that needs the job's two loader processes alive for 2 s after SIGTERM.
NEEDS_ITS_CHILDREN = """
import os, signal, sys, time
out = sys.argv[1]
pipes = []
for _ in range(2):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        while True:
            os.write(w, b".")
            time.sleep(0.05)
    os.close(w)
    pipes.append(r)
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "ready"), "w").close()
while not stop:
    time.sleep(0.05)
ok, deadline = True, time.monotonic() + 2
while time.monotonic() < deadline:
    for r in pipes:
        ok = ok and bool(os.read(r, 4096))
    time.sleep(0.05)
with open(os.path.join(out, "ckpt.done" if ok else "ckpt.broken"), "w") as f:
    f.write("step 7")
    f.flush()
    os.fsync(f.fileno())
"""


def test_a_users_nohup_job_adopted_from_its_login_is_contained_and_outlives_it(
    bed: Bed,
) -> None:
    """Non-root, on systemd: the login's session scope belongs to root, so the kernel
    refuses the move; the user's manager has the system manager move the processes into
    the adopted run's delegated scope. The proof: logind kills that login's processes at
    logout (KillUserProcesses=yes), and the adopted job lives on, then stops gracefully.
    """
    _alice(bed)
    assert bed.ssh("loginctl enable-linger alice").returncode == 0
    out = bed.out / "adopt"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    (out / "job.py").write_text(NEEDS_ITS_CHILDREN)
    job = "/mnt/out/adopt"
    login = (
        f"cd /tmp; nohup python3 {job}/job.py {job} </dev/null >/tmp/nohup.out 2>&1 & P=$!; "
        f"for _ in $(seq 100); do [ -e {job}/ready ] && break; sleep 0.1; done; "
        f"grep '^0::' /proc/$P/cgroup; {TC} adopt ad --pid $P --yes --json"
    )
    try:
        res = bed.ssh(login, user="alice", timeout=90)
        assert res.returncode == 0, (res.stdout, res.stderr)
        before, _, doc = res.stdout.partition("\n")
        assert "/session-" in before  # it was started in the login's scope
        assert '"contained": true' in doc, doc
        assert "moved by systemd" in doc
        assert '"log_from": "/tmp/nohup.out"' in doc
        time.sleep(3)  # the login is over: logind has killed what was left in its scope
        status = bed.ssh(f"{TC} status ad", user="alice")
        assert status.returncode == 0, (status.stdout, status.stderr)
        assert "contained in its own cgroup (moved by systemd)" in status.stdout
        where = _job_cgroup(bed, "ad", home="/home/alice/.local/state/trainctl")
        assert "/user@" in where  # the user's own manager, not the system one
        assert "/trainctl.slice/trainctl-ad-r1-" in where, where
        assert "session-" not in where
        stop = bed.ssh(f"{TC} stop ad", user="alice", timeout=90)
        assert stop.returncode == 0, (stop.stdout, stop.stderr)
        assert (out / "ckpt.done").read_text() == "step 7"  # its loaders lived to the end
        left = bed.ssh("systemctl --user list-units 'trainctl-ad*' --no-legend", user="alice")
        assert left.stdout.strip() == ""
        # The manager's refusal comes back in its own words (an ERROR reply, parsed).
        # (its own pid: a foreign one would have the system manager ask polkit, which this
        # bed does not have, and dbus-daemon can take its 25 s timeout to say so)
        # (this call hung in 4 of 6 busy CI runs until the client nudged a peer that sat
        # on its first message: see dbus.NUDGE_S and tests/systemd/test_dbus_client.py)
        ask = (
            "import os; from trainctl.supervisor.linux import systemd; "
            "print(systemd.attach('no.scope', '', [os.getpid()]))"
        )
        said = bed.ssh(f'python3 -c "{ask}"', user="alice", timeout=90)
        assert "org.freedesktop.systemd1.NoSuchUnit" in said.stdout, (said.stdout, said.stderr)
    finally:
        bed.ssh("loginctl disable-linger alice")


def test_a_queued_job_outlives_the_login_that_queued_it(bed: Bed) -> None:
    """Its waiter runs in a scope of its own: logind's KillUserProcesses=yes spares it."""
    res = bed.ssh(
        f"{TC} start --name qa --grace 2 -- sleep 600 && "
        f"{TC} start --name qb --after qa:any --json -- sh -c 'echo dispatched'"
    )
    assert res.returncode == 0, res.stderr
    assert '"state": "queued"' in res.stdout
    time.sleep(3)  # the login is over: its session scope has been torn down
    status = bed.ssh(f"{TC} status qb")
    assert "queued" in status.stdout, status.stdout
    assert "no waiter is running" not in status.stdout
    assert bed.ssh(f"{TC} stop qa").returncode == 0
    done = bed.ssh(f"{TC} wait qb --timeout 30")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "dispatched" in bed.ssh(f"{TC} logs qb").stdout
    left = bed.ssh("systemctl list-units 'trainctl-q*' --no-legend")
    assert left.stdout.strip() == ""


def test_a_host_shutdown_gives_the_job_its_own_graceful_stop(bed: Bed) -> None:
    """`systemctl poweroff` stops each scope; trainctl's scope turns that into its stop,
    and the checkpoint lands on its own mount, before systemd unmounts it.

    The layout of a GPU box: the home on the root file system, the checkpoints on a mount
    of their own (/mnt/out) and the cwd on a third (/mnt/code). A scope that is not ordered
    after the file systems is stopped side by side with their unmounting, and the job
    writes its checkpoint under the mount point instead (4 runs in 4 lost it).
    Runs last on the bed: the container is gone afterwards.
    """
    (bed.code / "job.py").write_text(NEEDS_ITS_CHILDREN)
    start = bed.ssh(
        f"{TC} start --name ck --grace 20 --cwd /mnt/code --set 'checkpoint=/mnt/out/ckpt.*'"
        " -- python3 job.py /mnt/out"
    )
    assert start.returncode == 0, start.stderr
    deadline = time.monotonic() + 30
    while not (bed.out / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (bed.out / "ready").exists()
    unit = bed.ssh(f"{TC} status ck --json").stdout
    name = unit.split('"unit": "', 1)[1].split('"', 1)[0]
    props = bed.ssh(f"systemctl show {name} -p After -p RequiresMountsFor").stdout
    assert "local-fs.target" in props, props
    assert "remote-fs.target" in props, props
    kept = props.split("RequiresMountsFor=", 1)[1].split()
    assert {"/mnt/out", "/mnt/code"} <= set(kept), props
    doctor = bed.ssh(f"{TC} doctor").stdout
    assert "job ck ordering" in doctor
    assert "keeps mounted" in doctor, doctor
    assert "NOT kept" not in doctor, doctor
    assert "MOUNTS" not in bed.ssh(f"{TC} status ck").stdout
    time.sleep(1)  # the supervisor serves (its signal handlers are in place)
    bed.ssh("systemctl poweroff", timeout=30)  # the login drops as the container goes down
    bed.nspawn.wait(120)
    assert not (bed.out / "ckpt.broken").exists(), "the loaders died before the checkpoint"
    assert (bed.out / "ckpt.done").read_text() == "step 7"  # on the mount, not under it


def test_a_host_without_systemd_is_unchanged(harness: Harness) -> None:
    from trainctl.supervisor.linux import systemd  # noqa: PLC0415

    if systemd.booted():
        pytest.skip("this host runs systemd: the bed tests cover it")
    h = harness
    doc = h.tc("start", "--name", "plain", "--json", "--", "sleep", "60", check=True).json()
    assert isinstance(doc, dict)
    assert doc["unit"] is None
    assert doc["warnings"] == []
    assert "not systemd" in h.tc("doctor").out
    assert h.tc("stop", "plain").rc == 0
