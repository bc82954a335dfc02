"""Untrusted files and inputs: no symlink is followed, no shared directory is chmodded,
every bad value is one line with exit 2 or 4 (never 70), and nothing outside the job is
ever signalled, whatever a state file claims.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Harness
from tests.helpers import one_line, stop_and_check

# ---------------------------------------------------------------- symlinks


def test_a_symlinked_job_dir_is_refused_and_its_target_untouched(harness: Harness) -> None:
    h = harness
    target = h.tmp / "elsewhere"
    target.mkdir()
    (h.home / "jobs").mkdir(parents=True)
    (h.home / "jobs" / "j").symlink_to(target)
    res = h.tc("start", "--name", "j", "--", "sleep", "60")
    assert res.rc == 4, res
    one_line(res)
    assert "symlink" in res.err
    assert list(target.iterdir()) == []
    for verb in (("status", "j"), ("stop", "j"), ("rm", "j"), ("rm", "j", "--force")):
        r = h.tc(*verb)
        assert r.rc == 4, (verb, r)
        one_line(r)
    assert (h.home / "jobs" / "j").is_symlink()


def test_a_planted_log_symlink_is_never_written_through(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "l", "--", "true", check=True)
    h.tc("wait", "l", "--timeout", "20")
    victim = h.tmp / "victim.txt"
    victim.write_text("precious\n")
    (h.home / "jobs" / "l" / "logs" / "run-2.log").symlink_to(victim)
    res = h.tc("start", "--name", "l", "--", "echo", "overwrite")
    assert res.rc == 1, res
    one_line(res)
    assert "symlink" in res.err
    assert victim.read_text() == "precious\n"
    assert h.state("l")["run"] == 1  # the failed start changed nothing


def test_a_shared_home_is_refused_not_chmodded(harness: Harness) -> None:
    h = harness
    shared = h.tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    env = {**h.env, "TRAINCTL_HOME": str(shared)}
    res = h.tc("start", "--name", "x", "--", "sleep", "60", env=env)
    assert res.rc == 2, res
    one_line(res)
    assert "writable by others" in res.err
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert list(shared.iterdir()) == []


# ---------------------------------------------------------------- what a state may claim


def _own_cgroup() -> Path | None:
    from trainctl.supervisor.linux import cgroup  # noqa: PLC0415

    mount, own = cgroup.find_mount(), cgroup.own_cgroup()
    return None if mount is None or own is None else mount / own.lstrip("/")


def test_a_cgroup_outside_trainctls_subtree_is_never_frozen_or_killed(harness: Harness) -> None:
    """The forged state names the cgroup this very test runs in."""
    h = harness
    ours = _own_cgroup()
    if ours is None or not (ours / "cgroup.procs").exists():
        pytest.skip("no cgroup v2 here")
    by = h.bystander("forker.py")
    h.tc("start", "--name", "cg", "--", "sleep", "600", check=True)
    path = h.home / "jobs" / "cg" / "state.json"
    doc = json.loads(path.read_text())
    doc["cgroup"] = str(ours)
    doc["mode"] = "cgroup"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    stop_and_check(h, "cg")  # the sleep dies; the test process and the bystander live on
    assert by.poll() is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("phase", "lost"),
        ("started_at", "yesterday"),
        ("started_at", float("nan")),
        ("cgroup", 7),
        ("last_stop", [1, 2]),
        ("restart_at", "soon"),
        ("members", [{"pid": "x"}]),
        ("main", {"pid": -1, "start_ticks": 5}),
        ("gpus", "0"),
        ("run", 0),
    ],
)
def test_a_mistyped_state_is_exit_4_and_list_shows_the_others(
    harness: Harness, field: str, value: object
) -> None:
    h = harness
    h.tc("start", "--name", "bad", "--", "true", check=True)
    h.tc("start", "--name", "good", "--", "true", check=True)
    h.tc("wait", "bad", "--timeout", "20")
    path = h.home / "jobs" / "bad" / "state.json"
    doc = json.loads(path.read_text())
    doc[field] = value
    path.write_text(json.dumps(doc))  # json writes nan as NaN, which Python reads back
    for verb in (("status", "bad"), ("stop", "bad"), ("ps", "bad"), ("wait", "bad")):
        res = h.tc(*verb)
        assert res.rc == 4, (verb, res)
        one_line(res)
    listing = h.tc("list")
    assert "good" in listing.out
    assert "bad" in listing.out
    assert listing.rc != 70


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_stop_works_from_state_when_spec_is_corrupt(harness: Harness, damage: str) -> None:
    h = harness
    h.start_tree("sp", "forker.py", grace=1)
    spec = h.home / "jobs" / "sp" / "spec.json"
    if damage == "corrupt":
        spec.write_text("{garbage")
    else:
        spec.unlink()
    res = h.tc("stop", "sp")
    assert res.rc == 0, res
    assert "spec.json" in res.err  # one warning says what it fell back to
    assert not h.job_pids("sp")


# ---------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("args", "config"),
    [
        (("start", "--name", "v", "--grace", "1e308", "--", "true"), ""),
        (("start", "--name", "v", "--set", "kill_wait=1e308", "--", "true"), ""),
        (("start", "--name", "v", "--set", "restart_backoff=1e308", "--", "true"), ""),
        (("start", "--name", "v", "--", "true"), "[stop]\ngrace_s = nan\n"),
        (("start", "--name", "v", "--", "true"), "[stop]\nkill_wait_s = inf\n"),
        (("start", "--name", "v", "--", "true"), "[supervisor]\nsnapshot_interval_s = 0.0\n"),
        (("start", "--name", "v", "--stop-signal", "", "--", "true"), ""),
        (("start", "--name", "v", "--set", 'argv="sleep \'1"'), ""),
        (("start", "--name", "v", "--set", "env={A-B='1'}", "--", "true"), ""),
        (("start", "--name", "v", "--set", "env={TRAINCTL_JOB='x'}", "--", "true"), ""),
    ],
)
def test_bad_values_are_one_line_exit_2(
    harness: Harness, args: tuple[str, ...], config: str
) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text(config)
    res = h.tc(*args)
    assert res.rc == 2, res
    one_line(res)
    assert not (h.home / "jobs" / "v").exists()


def test_a_binary_spec_file_is_one_line(harness: Harness) -> None:
    h = harness
    spec = h.tmp / "job.toml"
    spec.write_bytes(b"\x00\xff\xfe binary \x80")
    res = h.tc("start", "-c", str(spec))
    assert res.rc == 2, res
    one_line(res)


# ---------------------------------------------------------------- the terminal and names


def test_escape_sequences_from_the_job_never_reach_the_terminal(harness: Harness) -> None:
    h = harness
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[1;1Hfake line\x9b31m"
    code = f"import sys, time\nprint({evil!r}, flush=True)\ntime.sleep(60)\n"
    h.tc("start", "--name", "esc", "--", sys.executable, "-c", code, evil, check=True)
    log = h.home / "jobs" / "esc" / "logs" / "run-1.log"
    import time  # noqa: PLC0415

    deadline = time.monotonic() + 20
    while "fake" not in log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.05)
    for verb in (("status", "esc"), ("list",), ("ps", "esc")):
        out = h.tc(*verb).out
        assert not {"\x1b", "\x07", "\x9b"} & set(out), (verb, out)
    assert "^[" in h.tc("status", "esc").out
    stop_and_check(h, "esc")


def test_the_longest_name_works_under_a_long_home(harness: Harness) -> None:
    h = harness
    home = h.tmp / ("d" * 60) / "home"
    env = {**h.env, "TRAINCTL_HOME": str(home)}
    name = "n" * 64
    assert len(str(home / "jobs" / name / "control.sock")) > 108
    h.tc("start", "--name", name, "--", "sleep", "60", env=env, check=True)
    assert h.tc("status", name, env=env).rc == 0
    res = h.tc("stop", name, "--json", env=env)
    assert res.rc == 0, res
    assert res.json()["via"] == "supervisor"  # type: ignore[index]


def test_a_setuid_like_member_we_cannot_signal_is_named(harness: Harness) -> None:
    """Run as a second user, the stop meets a member owned by root: one line, no 70."""
    h = harness
    if os.geteuid() != 0 or not _useradd("tctest"):
        pytest.skip("needs root and useradd")
    try:
        _check_as_other_user(h)
    finally:
        os.system("userdel -r tctest >/dev/null 2>&1")  # noqa: S605


def _useradd(user: str) -> bool:
    os.system(f"userdel -r {user} >/dev/null 2>&1")  # noqa: S605
    return os.system(f"useradd -m {user} >/dev/null 2>&1") == 0  # noqa: S605


def _runtime_for_anyone(h: Harness) -> tuple[str, Path]:
    """A Python and a copy of trainctl with its dependencies that another user can run.

    This checkout, its venv or its interpreter may live under a private directory (/root,
    a `mktemp -d`); a system Python of the same version runs a world-readable copy.
    """
    import importlib.util  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    python = shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}", path="/usr/bin")
    if python is None:
        pytest.skip(
            f"no /usr/bin/python{sys.version_info[0]}.{sys.version_info[1]} to run as a second user"
        )
    lib = Path("/tmp") / f"trainctl-eperm-{h.mark}"
    lib.mkdir(mode=0o755)
    for mod in (
        "trainctl",
        "anyio",
        "click",
        "psutil",
        "sniffio",
        "idna",
        "pynvml",
        "typing_extensions",
    ):
        spec = importlib.util.find_spec(mod)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            src = Path(next(iter(spec.submodule_search_locations)))
            shutil.copytree(src, lib / mod, ignore=shutil.ignore_patterns("__pycache__"))
        elif spec.origin:
            shutil.copy(spec.origin, lib / Path(spec.origin).name)
    if Path(h.env["TRAINCTL_CONFIG"]).exists():  # the test's config, if it has one
        shutil.copy(h.env["TRAINCTL_CONFIG"], lib / "config.toml")
    os.system(f"chmod -R a+rX {lib}")  # noqa: S605
    return python, lib


def _check_as_other_user(h: Harness) -> None:
    import shutil  # noqa: PLC0415

    by = h.bystander("forker.py")  # root's process: a stranger to the other user
    start = int(Path(f"/proc/{by.pid}/stat").read_text().rpartition(")")[2].split()[19])
    home = Path("/home/tctest/tchome")
    python, lib = _runtime_for_anyone(h)
    env = {
        **h.env,
        "TRAINCTL_HOME": str(home),
        "TRAINCTL_CONFIG": str(lib / "config.toml"),
        "HOME": "/home/tctest",
        "PYTHONPATH": str(lib),
    }
    as_user = ["runuser", "-u", "tctest", "--", python, "-m", "trainctl.launcher"]
    try:
        _eperm_stop(h, by, start, home, env, as_user)
    finally:
        shutil.rmtree(lib, ignore_errors=True)


def _eperm_stop(
    h: Harness,
    by: subprocess.Popen[bytes],
    start: int,
    home: Path,
    env: dict[str, str],
    as_user: list[str],
) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # from /: this checkout may be in a private directory
            [*as_user, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd="/",
        )

    started = run("start", "--name", "f", "--set", "kill_wait=1", "--", "true")
    assert started.returncode == 0, started
    run("wait", "f", "--timeout", "20")
    path = home / "jobs" / "f" / "state.json"
    doc = json.loads(path.read_text())
    # a forged state in the user's own home, naming root's process as main
    doc.update(phase="running", main={"pid": by.pid, "start_ticks": start}, pgid=None, sid=None)
    doc.update(members=[], cgroup=None)
    data = json.dumps(doc)
    os.system(f"runuser -u tctest -- sh -c 'cat > {path}' <<'EOF'\n{data}\nEOF")  # noqa: S605
    res = run("stop", "f", "--grace", "0.2")
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr
    assert "not permitted" in res.stdout
    assert by.poll() is None
