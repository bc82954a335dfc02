"""Output into a reader that has gone (`| head -1`, a quit pager, a dropped ssh).

What the verb did stays done, its exit code says what it did, nothing is printed on
stderr and no crash file appears. The reader's end is closed before trainctl writes a
byte, so the very first write meets EPIPE.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TRAINCTL, Harness


def closed_reader(h: Harness, *args: str, fastpath: bool = True) -> tuple[int, str, list[Path]]:
    """Run trainctl with stdout on a pipe nobody reads; return (rc, stderr, crash files)."""
    crashes = h.tmp / "crashes"
    crashes.mkdir(exist_ok=True)
    env = {**h.env, "TMPDIR": str(crashes)}
    if not fastpath:
        env["TRAINCTL_NO_FASTPATH"] = "1"
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    try:
        p = subprocess.run(
            [*TRAINCTL, *args],
            env=env,
            stdout=w,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(w)
    return p.returncode, p.stderr, sorted(crashes.glob("trainctl-crash-*"))


@pytest.mark.parametrize("fastpath", [True, False], ids=["fast path", "click"])
def test_status_into_a_closed_pipe_keeps_its_exit_code(harness: Harness, fastpath: bool) -> None:
    h = harness
    h.tc("start", "--name", "p", "--", "sleep", "600", check=True)
    rc, err, crashes = closed_reader(h, "status", "p", fastpath=fastpath)
    assert (rc, err, crashes) == (0, "", [])
    h.tc("stop", "p", check=True)
    rc, err, crashes = closed_reader(h, "status", "p", fastpath=fastpath)
    assert (rc, err, crashes) == (3, "", [])  # 3: not running, as on a terminal


@pytest.mark.parametrize("fastpath", [True, False], ids=["fast path", "click"])
def test_stop_into_a_closed_pipe_stops_and_exits_0(harness: Harness, fastpath: bool) -> None:
    h = harness
    h.tc("start", "--name", "p", "--", "sleep", "600", check=True)
    pids = h.job_pids("p")
    assert pids
    rc, err, crashes = closed_reader(h, "stop", "p", fastpath=fastpath)
    assert (rc, err, crashes) == (0, "", [])
    assert not h.job_pids("p")
    assert h.tc("status", "p", "--json").json()["state"] == "stopped"  # type: ignore[index]


@pytest.mark.parametrize(
    "args",
    [
        ("list",),
        ("ps", "p"),
        ("logs", "p"),
        ("top", "--once"),
        ("top", "--json"),
        ("status", "p", "--json"),
        ("prune", "--older-than", "0", "--dry-run"),
    ],
    ids=" ".join,
)
def test_read_only_verbs_into_a_closed_pipe_end_quietly(
    harness: Harness, args: tuple[str, ...]
) -> None:
    h = harness
    h.tc("start", "--name", "p", "--", "sh", "-c", "seq 1 5000; sleep 600", check=True)
    rc, err, crashes = closed_reader(h, *args)
    assert (rc, err, crashes) == (0, "", [])
    h.tc("stop", "p", check=True)


def test_an_error_is_the_same_line_and_code_on_both_paths(harness: Harness) -> None:
    h = harness
    fast = h.tc("status", "ghost")
    slow = h.tc("status", "ghost", env={**h.env, "TRAINCTL_NO_FASTPATH": "1"})
    assert (fast.rc, fast.err) == (slow.rc, slow.err)
    assert fast.rc == 2
    assert fast.err.strip() == f"trainctl: error: no job named 'ghost' (in {h.home})"


def test_status_into_a_file_is_whole_on_both_paths(harness: Harness) -> None:
    """The fast path ends a status without the interpreter's teardown (main.py): what it
    wrote into a fully buffered sink (a file) must all be there, as through click."""
    h = harness
    h.tc("start", "--name", "f", "--", "sh", "-c", "echo " + "x" * 3000 + "; sleep 600",
         check=True)  # fmt: skip
    docs = []
    for env in (h.env, {**h.env, "TRAINCTL_NO_FASTPATH": "1"}):
        out = h.tmp / "status.json"
        with out.open("w") as f:
            p = subprocess.run(
                [*TRAINCTL, "status", "f", "--json"],
                env=env, stdout=f, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
            )  # fmt: skip
        assert (p.returncode, p.stderr) == (0, "")
        doc = json.loads(out.read_text())
        docs.append({k: v for k, v in doc.items() if k not in ("uptime_s", "stalled_for_s")})
    assert docs[0] == docs[1]
    assert docs[0]["last_log_line"].startswith("xxx")
    h.tc("stop", "f", check=True)


@pytest.mark.parametrize("args", [["status", "d"], ["status", "d", "--json"], ["list"]])
def test_a_full_disk_behind_stdout_is_one_line_not_a_crash(
    harness: Harness, args: list[str]
) -> None:
    """`trainctl status X > out.txt` on a full disk (ENOSPC, as /dev/full answers every
    write): one line saying so and exit 1, not "internal error, please report it"."""
    if not Path("/dev/full").is_char_device():
        pytest.skip("no /dev/full here (a container without it): nothing answers ENOSPC")
    h = harness
    h.tc("start", "--name", "d", "--", "sleep", "600", check=True)
    crashes = h.tmp / "crashes"
    crashes.mkdir(exist_ok=True)
    with open("/dev/full", "w") as full:
        p = subprocess.run([*TRAINCTL, *args], env={**h.env, "TMPDIR": str(crashes)},
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                           check=False)  # fmt: skip
    assert p.returncode == 1
    assert p.stderr == "trainctl: error: cannot write the output: No space left on device\n"
    assert sorted(crashes.glob("trainctl-crash-*")) == []
    h.tc("stop", "d", check=True)


@pytest.mark.parametrize("args", [["status", "e"], ["list"]])
def test_a_closed_stdout_is_one_line_not_a_crash(harness: Harness, args: list[str]) -> None:
    """`trainctl status X >&-` (fd 1 closed, as some cron and daemon set-ups leave it):
    Python's sys.stdout is None. One line and exit 1, as for a full disk, not a crash."""
    h = harness
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    crashes = h.tmp / "crashes"
    crashes.mkdir(exist_ok=True)
    p = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *TRAINCTL, *args],
                       env={**h.env, "TMPDIR": str(crashes)}, stderr=subprocess.PIPE,
                       text=True, timeout=60, check=False)  # fmt: skip
    assert p.returncode == 1
    assert p.stderr == "trainctl: error: cannot write the output: standard output is closed\n"
    assert sorted(crashes.glob("trainctl-crash-*")) == []
    h.tc("stop", "e", check=True)
