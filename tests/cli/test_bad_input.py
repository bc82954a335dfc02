"""Bad input: one clear line on stderr, a non-zero exit, nothing changed, nothing signalled."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TRAINCTL, Harness, _stat, alive, wait_for
from tests.helpers import one_line_error


def no_jobs(h: Harness) -> None:
    jobs = h.home / "jobs"
    assert not jobs.exists() or not list(jobs.iterdir())


@pytest.mark.parametrize(
    ("args", "rc", "needle"),
    [
        (["start", "--name", "x"], 2, "no command given"),
        (["start", "--name", "x", "--grace", "-1", "--", "true"], 2, "non-negative"),
        (["start", "--name", "x", "--grace", "soon", "--", "true"], 2, "is not a duration"),
        (["start", "--name", "x", "--grace", "nan", "--", "true"], 2, "non-negative"),
        (["start", "--name", "x", "--stop-signal", "SIGFOO", "--", "true"], 2, "unknown signal"),
        (["start", "--name", "x", "--stop-signal", "KILL", "--", "true"], 2, "cannot be caught"),
        (["start", "--name", "x", "--cwd", "/nonexistent/dir", "--", "true"], 1, "does not exist"),
        (["start", "--name", "x", "--", "no-such-command-xyz"], 1, "command not found"),
        (["start", "--name", "x", "--", "./missing.sh"], 1, "command not found"),
        (["start", "--name", "../evil", "--", "true"], 2, "invalid job name"),
        (["start", "--name", "nl\n", "--", "true"], 2, "invalid job name"),  # "$" slip
        (["start", "--name", "x", "--env", "NOEQUALS", "--", "true"], 2, "KEY=VALUE"),
        (["start", "--name", "x", "--env", "TRAINCTL_JOB=1", "--", "true"], 2, "cannot set"),
        (["stop", "ghost"], 2, "no job named"),
        (["status", "ghost"], 2, "no job named"),
        (["logs", "ghost"], 2, "no job named"),
        (["ps", "ghost"], 2, "no job named"),
        (["wait", "ghost"], 2, "no job named"),
        (["rm", "ghost"], 2, "no job named"),
        (["restart", "ghost"], 2, "no job named"),
        (["stop"], 2, "name a job (or several), or --all"),
        (["frobnicate"], 2, "No such command"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    harness: Harness, args: list[str], rc: int, needle: str
) -> None:
    one_line_error(harness.tc(*args), rc, needle)
    no_jobs(harness)


def test_exec_failure_inside_supervisor_leaves_nothing(harness: Harness) -> None:
    """A file that passes the CLI's checks but cannot be exec'd (no shebang, not ELF)."""
    h = harness
    bad = h.tmp / "notexec"
    bad.write_text("just text\n")
    bad.chmod(0o755)
    one_line_error(h.tc("start", "--name", "bad", "--", str(bad)), 1, "cannot execute")
    no_jobs(h)


def test_unwritable_home(harness: Harness) -> None:
    h = harness
    blocker = h.tmp / "file"
    blocker.write_text("")
    env = {**h.env, "TRAINCTL_HOME": str(blocker / "home")}
    one_line_error(h.tc("start", "--name", "x", "--", "true", env=env), 2, "TRAINCTL_HOME")


def test_bad_config_file(harness: Harness) -> None:
    h = harness
    cfg = Path(h.env["TRAINCTL_CONFIG"])
    # "5 minutes" is a duration since issue 36 ("accept what systemd and humans write")
    cfg.write_text('[stop]\ngrace = "5 fortnights"\n')
    said = "stop.grace: '5 fortnights' is not"
    one_line_error(h.tc("start", "--name", "x", "--", "true"), 2, said)
    cfg.write_text("[stop]\ngracee = 5\n")
    one_line_error(h.tc("start", "--name", "x", "--", "true"), 2, "did you mean stop.grace?")
    cfg.write_text("[stop\n")
    one_line_error(h.tc("start", "--name", "x", "--", "true"), 2, "invalid TOML")
    cfg.write_text("[stop]\ngrace_s = -4\n")
    one_line_error(h.tc("start", "--name", "x", "--", "true"), 2, "must be a non-negative")
    cfg.write_text("[stop]\nsignal = 15\n")
    one_line_error(h.tc("start", "--name", "x", "--", "true"), 2, "must be str")
    no_jobs(h)


def test_name_clash_refused(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "one", "--", "sleep", "600", check=True)
    # the supervisor records the code version, its first code-drift check and its first
    # member snapshot just after `start` returns: let them all land (in any order)
    for key in ("code", "drift_checked_at", "snapshot_at"):
        wait_for(lambda k=key: h.state("one").get(k) is not None, what=key)
    before = h.state("one")
    one_line_error(h.tc("start", "--name", "one", "--", "sleep", "1"), 1, "is running")
    assert h.state("one") == before
    h.tc("stop", "one", check=True)


def test_rm_refuses_running_job(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "busy", "--", "sleep", "600", check=True)
    one_line_error(h.tc("rm", "busy"), 1, "stop it before removing")
    h.tc("stop", "busy", check=True)


def _finished_job(h: Harness, name: str) -> Path:
    h.tc("start", "--name", name, "--", "true", check=True)
    h.tc("wait", name, "--timeout", "30")
    return h.home / "jobs" / name / "state.json"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: '{"schema": 1, "name": ', "corrupt or truncated"),
        (lambda t: "", "corrupt or truncated"),
        # a newer schema (99) is read for what this trainctl knows: tests/upgrade/
        (lambda t: t.replace('"schema": 1', '"schema": 0'), "unknown schema"),
        (lambda t: t.replace('"schema": 1', '"schema": "1"'), "unknown schema"),
        (
            lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "marker"}),
            "malformed",
        ),
        (lambda t: "[1, 2]", "not a JSON object"),
    ],
)
def test_untrusted_state_is_never_acted_on(harness: Harness, mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    h = harness
    path = _finished_job(h, "st")
    path.write_text(mutate(path.read_text()))
    for verb in ("stop", "status", "restart"):
        one_line_error(h.tc(verb, "st"), 4, needle)
    one_line_error(h.tc("start", "--name", "st", "--", "true"), 4, needle)
    assert h.tc("rm", "st", "--force").rc == 0


def test_foreign_owned_state_is_refused(harness: Harness) -> None:
    h = harness
    path = _finished_job(h, "foreign")
    os.chown(path, 65534, 65534)
    one_line_error(h.tc("stop", "foreign"), 4, "owned by uid 65534")
    path.chmod(0o666)
    os.chown(path, os.geteuid(), os.getegid())
    one_line_error(h.tc("status", "foreign"), 4, "writable by other users")


def test_stale_state_with_recycled_pid_never_signals_it(harness: Harness) -> None:
    """state.json claims a running main whose pid now belongs to an unrelated process."""
    h = harness
    path = _finished_job(h, "stale")
    victim = h.bystander("ignore_signals.py")
    st = _stat(victim.pid)
    assert st is not None
    doc = json.loads(path.read_text())
    fake_main = {"pid": victim.pid, "start_ticks": st[1] - 7}  # same pid, other start time
    doc.update(
        phase="running",
        main=fake_main,
        pgid=victim.pid,
        sid=victim.pid,
        supervisor={"pid": victim.pid, "start_ticks": st[1] - 7},
        cgroup=None,
    )
    path.write_text(json.dumps(doc))
    res = h.tc("stop", "stale", "--grace", "0.5")
    # nothing of the run is found; no cgroup and no supervisor: not proof, exit 6
    assert res.rc == 6, res
    assert "nothing of its run was found" in res.out
    assert "no cgroup and no supervisor" in res.out
    assert alive(victim.pid, st[1])
    h.assert_bystanders_alive()


def test_concurrent_stops_never_double_signal(harness: Harness) -> None:
    h = harness
    sigs = h.tmp / "signals.txt"
    h.start_tree(
        "ck",
        "checkpointer.py",
        str(h.tmp),
        "1.5",
        extra=("--env", f"TREE_SIGNALS={sigs}"),
        grace=10,
    )
    procs = [
        subprocess.Popen(
            [*TRAINCTL, "stop", "ck", "--json"],
            env=h.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert sigs.read_text().count("SIGTERM") == 1, sigs.read_text()
    assert (h.tmp / "ckpt.done").exists()


def test_help_exits_zero(harness: Harness) -> None:
    for args in (["--help"], ["start", "--help"], ["stop", "-h"], ["--version"]):
        res = harness.tc(*args)
        assert res.rc == 0
        assert res.out


def _text_options() -> list[tuple[str, str]]:
    """(verb, option) for every text-valued option of every verb, and the global ones."""
    import click  # noqa: PLC0415

    from trainctl.launcher.cli import cli  # noqa: PLC0415

    def text(p: click.Parameter) -> bool:
        typed = p.type is click.STRING or isinstance(p.type, click.Path)
        return isinstance(p, click.Option) and not p.is_flag and typed

    found = [("", max(p.opts, key=len)) for p in cli.params if text(p)]
    for verb, command in sorted(cli.commands.items()):
        found += [(verb, max(p.opts, key=len)) for p in command.params if text(p)]
    return found


def test_every_text_option_refuses_an_empty_value(harness: Harness) -> None:
    """Issue 44 §4: `start --name ''` named the job after its command. An empty value of
    any option that takes text (a name, a path, a host, a duration) is one line, exit 2."""
    h = harness
    options = _text_options()
    assert len(options) > 30  # the sweep reaches every verb (else it proves little)
    wrong = []
    for verb, opt in options:
        argv = [opt, "", "list"] if not verb else [verb, opt, ""]
        res = h.tc(*argv)
        lines = res.err.strip().splitlines()
        if res.rc != 2 or len(lines) != 1 or "empty value" not in lines[0]:
            wrong.append(f"{' '.join(argv)!r}: rc {res.rc}: {res.err.strip()[:120]}")
    assert not wrong, "\n".join(wrong)
    no_jobs(h)


_BAD_NAMES = ["", "job\n", "j" * 65, "-lead", "a b"]


@pytest.mark.parametrize("bad", _BAD_NAMES)
@pytest.mark.parametrize(
    "where",
    ["--name", "--after", "spec", "status", "stop", "logs", "deploy", "adopt", "attach", "wait"],
)
def test_every_name_refuses_a_bad_value(harness: Harness, where: str, bad: str) -> None:
    """A bad name anywhere a job is named: one line, exit 2, nothing made."""
    h = harness
    if where == "--name":
        res = h.tc("start", "--name", bad, "--", "true")
    elif where == "--after":
        res = h.tc("start", "--name", "ok", "--after", bad, "--", "true")
    elif where == "spec":
        spec = h.tmp / "job.toml"
        spec.write_text(f"name = {json.dumps(bad)}\nargv = ['true']\n")
        res = h.tc("start", "-c", str(spec))
    elif where == "adopt":
        res = h.tc("adopt", bad, "--pid", str(os.getpid()))
    else:
        res = h.tc(where, bad)
    if bad.startswith("-") and where not in ("--name", "--after", "spec"):
        assert res.rc == 2, res  # click reads it as an option: its own one line
        assert len(res.err.strip().splitlines()) == 1, res.err
    else:
        one_line_error(res, 2, "empty value" if not bad else "name")
    no_jobs(h)


def test_a_nul_in_a_spec_files_name_is_one_line(harness: Harness) -> None:
    """NUL cannot pass through argv (execve refuses it); a spec file can hold one."""
    h = harness
    spec = h.tmp / "job.toml"
    spec.write_text('name = "a\\u0000b"\nargv = ["true"]\n')
    one_line_error(h.tc("start", "-c", str(spec)), 2, "name")
    for bad in ['cwd = "/tmp\\u0000x"', 'argv = ["a\\u0000b"]', 'env = { A = "\\u0000" }']:
        argv = "" if bad.startswith("argv") else 'argv = ["true"]\n'
        spec.write_text(f'name = "ok"\n{argv}{bad}\n')
        one_line_error(h.tc("start", "-c", str(spec)), 2, "NUL")
    no_jobs(h)


@pytest.mark.skipif(os.geteuid() != 0, reason="a link owned by someone else needs root")
def test_a_home_link_that_someone_else_owns_is_refused(harness: Harness) -> None:
    h = harness
    real = h.tmp / "theirs"
    real.mkdir(mode=0o700)
    link = h.tmp / "their-link"
    link.symlink_to(real)
    os.lchown(link, 65534, -1)
    env = {**h.env, "TRAINCTL_HOME": str(link)}
    one_line_error(h.tc("start", "--name", "x", "--", "true", env=env), 2, "not by you")
    assert not list(real.iterdir())
