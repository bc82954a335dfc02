"""Every verb over a real OpenSSH server on 127.0.0.1 (started here, with generated keys).

The client uses a test ssh config file, never the user's. A small wrapper script stands
in for `pct exec 200 --`: it enters another working directory and environment (and puts
the test's marker into it, so the harness still sees every remote process).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TRAINCTL, Harness, wait_for
from tests.helpers import Pane, free_port, one_line_error

pytestmark = pytest.mark.slow  # starts a real sshd / Slurm cluster

SSHD = Path("/usr/sbin/sshd")
REMOTE_TRAINCTL = Path(sys.executable).parent / "trainctl"


@dataclass
class Sshd:
    """A running test sshd and the files a client needs to reach it."""

    port: int
    config: Path  # ssh client config with Host "lab"
    client_key: Path
    other_key: Path
    tmp: Path


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.skip("sshd not installed (apt-get install openssh-server)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd runs as root (it logs in as the current user: root)")
    tmp = tmp_path_factory.mktemp("sshd")
    for key in ("hostkey", "client", "other"):
        _keygen(tmp / key)
    (tmp / "authorized_keys").write_text((tmp / "client.pub").read_text())
    port = free_port()
    (tmp / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {tmp}/hostkey
PidFile {tmp}/sshd.pid
AuthorizedKeysFile {tmp}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
""")
    host_pub = (tmp / "hostkey.pub").read_text().split()
    (tmp / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (tmp / "ssh_config").write_text(f"""Host lab
  HostName 127.0.0.1
  Port {port}
  User root
  IdentityFile {tmp}/client
  IdentitiesOnly yes
  UserKnownHostsFile {tmp}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
""")
    (tmp / "ssh_config_bare").write_text(f"""Host *
  UserKnownHostsFile {tmp}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
""")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    log = tmp / "sshd.log"
    with open(log, "wb") as errf:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(tmp / "sshd_config")], stderr=errf
        )
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            pytest.skip(f"sshd cannot run here: {log.read_text().strip()[:200]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.skip("sshd did not start listening")
            time.sleep(0.05)
    yield Sshd(port, tmp / "ssh_config", tmp / "client", tmp / "other", tmp)
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def lab(harness: Harness, sshd: Sshd) -> Harness:
    """The harness with hosts.toml aliases for the test sshd."""
    h = harness
    container = h.tmp / "container-root"
    container.mkdir()
    enter = h.tmp / "enter.sh"
    enter.write_text(f"""#!/bin/sh
# stands in for `pct exec 200 --`: another cwd and environment
cd {container} || exit 1
export CONTAINER=ct200 TCTEST_MARK={h.mark}
exec "$@"
""")
    enter.chmod(0o755)
    common = f'ssh_config = "{sshd.config}"\ntrainctl = "{REMOTE_TRAINCTL}"\n'
    hosts = h.tmp / "hosts.toml"
    hosts.write_text(f"""[hosts.lab]
target = "lab"
{common}prefix = ["{enter}"]
home = "{h.home}"

[hosts.closed]
target = "lab"
port = {free_port()}
{common}
[hosts.wrongkey]
target = "root@127.0.0.1"
port = {sshd.port}
identity = "{sshd.other_key}"
ssh_config = "{sshd.tmp / "ssh_config_bare"}"
trainctl = "{REMOTE_TRAINCTL}"

[hosts.notrainctl]
target = "lab"
ssh_config = "{sshd.config}"
trainctl = "trainctl-not-installed-here"
prefix = ["{enter}"]

[hosts.badprefix]
target = "lab"
{common}prefix = ["/bin/false"]

[hosts.prefix255]
target = "lab"
{common}prefix = ["sh", "-c", "echo container 200 is not running >&2; exit 255"]
""")
    h.env["TRAINCTL_HOSTS"] = str(hosts)
    return h


def test_remote_lifecycle(lab: Harness) -> None:
    h = lab
    script = h.tmp / "train.py"
    script.write_text(
        "import os, time\nprint('cwd', os.getcwd(), 'ct', os.environ['CONTAINER'],"
        " flush=True)\nwhile True:\n    print('tick', flush=True); time.sleep(0.2)\n"
    )
    t0 = time.monotonic()
    res = h.tc(
        "--host",
        "lab",
        "start",
        "--name",
        "rj",
        "--grace",
        "1",
        "--json",
        "--",
        sys.executable,
        str(script),
    )
    took = time.monotonic() - t0
    assert res.rc == 0, res.err
    assert took < 10  # a hang on inherited stdio would hit the harness timeout instead
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["run"] == 1
    # the ssh session is over; the job lives on, inside the "container"
    st = h.tc("--host", "lab", "status", "rj", "--json")
    assert st.rc == 0
    assert st.json()["state"] == "running"  # type: ignore[index]
    wait_for(lambda: "tick" in h.tc("--host", "lab", "logs", "rj", "-n", "1").out)
    first = h.tc("--host", "lab", "logs", "rj").out.splitlines()[0]
    assert first == f"cwd {h.tmp / 'container-root'} ct ct200"
    ps = h.tc("--host", "lab", "ps", "rj", "--json").json()
    assert isinstance(ps, list)
    assert ps[0]["pid"] == doc["main_pid"]
    # logs -f streams; Ctrl-C detaches and leaves no remote follower behind (the harness
    # would report it as a leak: it carries the test marker from the wrapper)
    follower = subprocess.Popen(
        [*TRAINCTL, "--host", "lab", "logs", "rj", "-f", "-n", "all"],
        env=h.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert follower.stdout is not None
    assert b"cwd" in follower.stdout.readline()  # the log so far, then new lines
    assert b"tick" in follower.stdout.readline()
    follower.send_signal(signal.SIGINT)  # our own child: the Ctrl-C
    follower.communicate(timeout=20)
    assert h.tc("--host", "lab", "status", "rj").rc == 0  # Ctrl-C did not stop the job
    stop = h.tc("--host", "lab", "stop", "rj", "--json")
    assert stop.rc == 0
    assert stop.json()["ok"] is True  # type: ignore[index]
    assert not h.job_pids("rj")
    assert h.tc("--host", "lab", "status", "rj").rc == 3  # exit codes come back


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed (apt-get install tmux)")
def test_top_over_ssh_gets_a_terminal(lab: Harness) -> None:
    h = lab
    h.tc("--host", "lab", "start", "--name", "far", "--", "sleep", "600", check=True)
    pane = Pane(h, [*TRAINCTL, "--host", "lab", "top", "--interval", "0.3"])
    try:
        wait_for(lambda: "far" in pane.screen() and "running" in pane.screen(), 30, "remote top")
        pane.keys("q")
        wait_for(pane.ended, 15, "remote top to quit on q")
    finally:
        pane.close()
    assert h.tc("--host", "lab", "stop", "far").rc == 0


def test_attach_over_ssh_types_into_the_remote_job(lab: Harness) -> None:
    """`--host lab attach` runs through ssh -t: keys reach the job on the far side, the
    detach keys leave it running there."""
    h = lab
    echo = "import sys\nprint('ready', flush=True)\nfor l in sys.stdin: print('got', l.strip())"
    h.tc(
        "--host", "lab", "start", "--name", "far", "--tty", "--", sys.executable, "-c", echo,
        check=True,
    )  # fmt: skip
    pane = Pane(h, [*TRAINCTL, "--host", "lab", "attach", "far"])
    try:
        wait_for(lambda: "ready" in pane.screen(), 30, "the remote job's screen")
        pane.keys("hello there", "Enter")
        wait_for(lambda: "got hello there" in pane.screen(), 15, "the job's answer")
        pane.keys("C-\\", "d")
        wait_for(pane.ended, 15, "the detach")
    finally:
        pane.close()
    assert h.tc("--host", "lab", "status", "far").rc == 0  # still running over there
    assert "got hello there" in h.tc("--host", "lab", "logs", "far").out
    assert h.tc("--host", "lab", "stop", "far").rc == 0


def test_argv_survives_quoting(lab: Harness) -> None:
    h = lab
    tricky = ["a b", "it's", "$HOME", '"q"', "semi;colon", "back\\slash", "*", "", "$(id)"]
    res = h.tc(
        "--host=lab",
        "start",
        "--name",
        "q",
        "--",
        sys.executable,
        "-c",
        "import sys, json; print(json.dumps(sys.argv[1:]), flush=True)",
        *tricky,
    )
    assert res.rc == 0, res.err
    h.tc("wait", "q", "--timeout", "30")
    import json  # noqa: PLC0415

    assert json.loads(h.tc("--host", "lab", "logs", "q").out) == tricky


def test_restart_over_ssh_runs_new_code(lab: Harness) -> None:
    h = lab
    code = h.tmp / "v.py"
    code.write_text("import time\nprint('v1', flush=True)\ntime.sleep(600)\n")
    env = {**h.env, "TRAINCTL_HOST": "lab"}
    h.tc(
        "start",
        "--name",
        "rs",
        "--grace",
        "1",
        "--",
        sys.executable,
        str(code),
        env=env,
        check=True,
    )
    wait_for(lambda: "v1" in h.tc("logs", "rs", env=env).out)
    code.write_text("import time\nprint('v2', flush=True)\ntime.sleep(600)\n")  # "deploy"
    assert h.tc("restart", "rs", env=env).rc == 0
    wait_for(lambda: "v2" in h.tc("logs", "rs", env=env).out)
    assert h.tc("stop", "rs", env=env).rc == 0


def test_list_and_gpus_over_every_host_at_once(lab: Harness) -> None:
    h = lab
    env = {**h.env, "TRAINCTL_HOST": "lab"}
    h.tc("start", "--name", "fleet", "--", "sleep", "60", env=env, check=True)
    t0 = time.monotonic()
    res = h.tc("list", "--all-hosts", "--json", timeout=120)
    took = time.monotonic() - t0
    assert res.rc == 5, res  # some hosts did not answer: the remote exit code
    answers = {a["host"]: a for a in res.json()}
    assert list(answers) == ["lab", "closed", "wrongkey", "notrainctl", "badprefix", "prefix255"]
    assert [j["name"] for j in answers["lab"]["doc"]] == ["fleet"]
    assert answers["lab"]["error"] is None
    assert "unreachable: connection refused" in answers["closed"]["error"]
    assert "authentication refused" in answers["wrongkey"]["error"]
    assert "trainctl not found on notrainctl" in answers["notrainctl"]["error"]
    assert "container 200 is not running" in answers["prefix255"]["error"]
    slowest = max(a["seconds"] for a in answers.values())
    assert took < 3 * slowest + 5  # asked at once, not one after another (a hang bound)
    table = h.tc("list", "--all-hosts", timeout=120)
    assert table.out.splitlines()[0].startswith("HOST")
    row = next(x for x in table.out.splitlines() if x.startswith("lab "))
    assert "fleet" in row
    assert "running" in row
    closed = next(x for x in table.out.splitlines() if x.startswith("closed "))
    assert "unreachable" in closed
    gpus = h.tc("gpus", "--all-hosts", "--json", timeout=120)
    assert {a["host"] for a in gpus.json()} == set(answers)
    frame = h.tc("top", "--all-hosts", "--json", timeout=120).json()
    lab_frame = next(a for a in frame if a["host"] == "lab")["doc"]
    assert [j["name"] for j in lab_frame["jobs"]] == ["fleet"]
    once = h.tc("top", "--all-hosts", "--once", timeout=120)
    assert "fleet" in once.out
    assert "unreachable" in once.out
    assert h.tc("stop", "fleet", env=env).rc == 0


def test_deploy_and_history_over_ssh(lab: Harness) -> None:
    from tests.keeper.test_deploy import progress, repo, version  # noqa: PLC0415

    h = lab
    r = repo(h)
    ck = h.tmp / "ck"
    ck.mkdir()
    env = {**h.env, "TRAINCTL_HOST": "lab"}
    h.tc(
        "start", "--name", "rd", "--cwd", str(r), "--grace", "5", "--set", "snapshot=git",
        "--set", f"checkpoint={ck}/ckpt-*.txt", "--", sys.executable, "train.py", str(ck),
        env=env, check=True,
    )  # fmt: skip
    wait_for(lambda: progress(h, "rd", 1) >= 3, 30, "rd to make progress")
    new = version(r, 2)
    res = h.tc("deploy", "rd", "--health", "30s", "--json", env=env, timeout=120)
    assert res.rc == 0, res
    assert res.json()["to_commit"] == new[:12]
    rows = h.tc("history", "rd", "--json", env=env, check=True).json()
    assert [row["commit"] for row in rows][-1] == new
    assert h.tc("stop", "rd", env=env).rc == 0


@pytest.mark.parametrize(
    ("alias", "needle"),
    [
        ("closed", "unreachable: connection refused"),
        ("wrongkey", "unreachable: authentication refused"),
        ("notrainctl", "trainctl not found on notrainctl"),
        ("badprefix", "container prefix '/bin/false' failed"),
        ("prefix255", "container 200 is not running"),  # its own 255, not ssh's
    ],
)
def test_remote_failures_are_one_line_exit_5(lab: Harness, alias: str, needle: str) -> None:
    one_line_error(lab.tc("--host", alias, "list"), 5, needle)


def test_remote_errors_and_exit_codes_pass_through(lab: Harness) -> None:
    one_line_error(lab.tc("--host", "lab", "status", "ghost"), 2, "no job named 'ghost'")


def test_hosts_check(lab: Harness) -> None:
    res = lab.tc("hosts", "--check", "--json")
    rows = {r["name"]: r for r in res.json()}  # type: ignore[union-attr]
    assert rows["lab"]["compatible"] is True
    assert rows["lab"]["trainctl"] is True
    assert rows["notrainctl"]["trainctl"] is False
    assert res.rc == 5  # some hosts failed the check
    human = lab.tc("hosts")
    assert human.rc == 0
    assert "lab" in human.out


def test_incompatible_client_version_is_refused(harness: Harness) -> None:
    res = harness.tc("list", env={**harness.env, "TRAINCTL_CLIENT_VERSION": "9.9.0"})
    one_line_error(res, 5, "incompatible trainctl versions")


def test_a_jobs_own_host_and_home_flags_stay_the_jobs(lab: Harness) -> None:
    """`--host 0.0.0.0` / `--home D` in the job's argv, without `--`, belong to the job."""
    h = lab
    dump = h.tmp / "container-root" / "argv-env.json"
    code = (
        "import json, os, sys\n"
        f"open({str(dump)!r}, 'w').write(json.dumps([sys.argv[1:], dict(os.environ)]))\n"
    )
    res = h.tc(
        "--host", "lab", "start", "--name", "srv",
        sys.executable, "-c", code, "--host", "0.0.0.0", "--home", "/elsewhere",
    )  # fmt: skip
    assert res.rc == 0, res.err
    wait_for(dump.exists, 30, "the job to write its argv")
    import json  # noqa: PLC0415

    argv, env = json.loads(dump.read_text())
    assert argv == ["--host", "0.0.0.0", "--home", "/elsewhere"]
    assert (h.home / "jobs" / "srv").is_dir()  # the alias's home, not /elsewhere
    assert "TCV" not in env
    assert "TRAINCTL_CLIENT_VERSION" not in env
    assert json.loads((h.home / "jobs" / "srv" / "spec.json").read_text())["env"].get("TCV") is None


def test_a_local_job_with_a_host_flag_runs_here(harness: Harness) -> None:
    h = harness
    out = h.tmp / "argv.txt"
    code = f"import sys\nopen({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
    res = h.tc("start", "--name", "here", sys.executable, "-c", code, "--host", "0.0.0.0")
    assert res.rc == 0, res.err
    wait_for(out.exists, 30, "the local job")
    assert out.read_text() == "--host 0.0.0.0"
