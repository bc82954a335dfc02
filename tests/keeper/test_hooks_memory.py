"""Memory caps, OOM kills named, hooks and notifications: real cgroups, a real HTTP server."""

from __future__ import annotations

import http.server
import json
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from tests.helpers import free_port

HOG = textwrap.dedent(
    """
    import os, subprocess, sys, time
    def allocate():
        block = bytearray(512 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
    print("allocating", flush=True)
    if sys.argv[1] == "child":
        code = subprocess.call([sys.executable, __file__, "main"])
        print("the loader died with", code, flush=True)
        sys.exit(3)
    allocate()
    print("still alive?", flush=True)
    """
)

HOOK = textwrap.dedent(
    """\
    #!/bin/sh
    # whole or not at all: the test waits for the file to appear
    env | grep '^TRAINCTL_' | sort > "$0.$TRAINCTL_EVENT.tmp"
    mv "$0.$TRAINCTL_EVENT.tmp" "$0.$TRAINCTL_EVENT.env"
    echo "hook saw $TRAINCTL_CAUSE"
    """
)


def _memory_cap_possible() -> str | None:
    sys.path.insert(0, str(Path(__file__).parents[2]))
    from trainctl.supervisor.linux import memory  # noqa: PLC0415

    home = memory.find_home()
    return home if isinstance(home, str) else None


class Receiver:
    """A real HTTP server on 127.0.0.1 that keeps every JSON document POSTed to it."""

    def __init__(self) -> None:
        self.docs: list[dict] = []  # type: ignore[type-arg]
        got = self.docs

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _hook(h: Harness) -> Path:
    hook = h.tmp / "hook.sh"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    return hook


needs_memory = pytest.mark.skipif(
    _memory_cap_possible() is not None, reason=f"no memory cap here: {_memory_cap_possible()}"
)


@needs_memory
@pytest.mark.parametrize("who", ["main", "child"])
def test_a_capped_job_is_oom_killed_named_hooked_and_notified(
    harness: Harness, receiver: Receiver, who: str
) -> None:
    h = harness
    script = h.tmp / "hog.py"
    script.write_text(HOG)
    hook = _hook(h)
    h.tc(
        "start", "--name", "hog", "--set", 'memory_max="64M"', "--set", f'on_failure="{hook}"',
        "--set", f'notify="{receiver.url}"', "--", sys.executable, str(script), who,
        check=True,
    )  # fmt: skip
    doc = h.tc("wait", "hog", "--json", timeout=60).json()
    assert isinstance(doc, dict)
    cause = doc["cause"]
    assert cause["kind"] == "oom", cause
    assert cause["cap_bytes"] == 64 << 20
    assert cause["oom_kills"] >= 1
    assert doc["exit_code"] == (137 if who == "main" else 3)
    if who == "main":  # named from its exit status, or the kernel log where it is readable
        assert cause["oom_pid"] == h.state("hog")["main"]["pid"]
        assert cause["oom_cmd"].endswith("hog.py main")
    elif cause.get("oom_pid"):  # the child is named only where /dev/kmsg can be read
        assert cause["oom_pid"] != h.state("hog")["main"]["pid"]
    env_file = Path(f"{hook}.failure.env")
    wait_for(env_file.exists, 20, "the on_failure hook")
    wait_for(lambda: any(e["event"] == "hook_ran" for e in h.events("hog")), 20, "hook event")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["TRAINCTL_CAUSE"] == "oom"
    assert env["TRAINCTL_JOB"] == "hog"
    assert env["TRAINCTL_EXIT_CODE"] == str(doc["exit_code"])
    assert "OOM-killed" in env["TRAINCTL_SUMMARY"]
    assert Path(env["TRAINCTL_LOG"]).exists()
    assert "allocating" in Path(env["TRAINCTL_LAST_LINES"]).read_text()
    wait_for(lambda: receiver.docs, 20, "the notify document")
    [sent] = receiver.docs  # one document for the failed end, not one per hook event
    assert (sent["job"], sent["event"], sent["cause"]) == ("hog", "failure", "oom")
    assert "OOM-killed" in sent["text"]
    assert sent["content"] == sent["text"]
    assert sent["run"] == 1
    assert sent["duration_s"] > 0
    assert "allocating" in sent["last_lines"]
    ran = [e for e in h.events("hog") if e["event"] == "hook_ran"]
    assert ran[0]["output"] == "hook saw oom\n"
    text = h.tc("status", "hog").out
    assert "cause OOM-killed" in text
    assert "OOM kill(s) in the job" in text


@needs_memory
def test_status_shows_use_against_the_cap(harness: Harness) -> None:
    h = harness
    h.start_tree("capped", "fanout.py", "1", "1", extra=("--set", 'memory_max="1G"'))
    doc = h.tc("status", "capped", "--json").json()
    assert isinstance(doc, dict)
    mem = doc["memory"]
    assert mem["max_bytes"] == 1 << 30
    assert 0 < mem["used_bytes"] < 1 << 30
    assert "of 1.0G (memory_max)" in h.tc("status", "capped").out
    h.tc("stop", "capped", check=True)


def test_hooks_never_delay_a_stop_and_time_out(harness: Harness) -> None:
    h = harness
    slow = h.tmp / "slow.sh"
    slow.write_text("#!/bin/sh\necho started\nsleep 30\n")
    slow.chmod(0o755)
    h.start_tree(
        "slowhook", "fanout.py", "1", "1",
        extra=("--set", f'on_exit="{slow}"', "--set", 'hook_timeout="2s"'),
    )  # fmt: skip
    t0 = time.monotonic()
    h.tc("stop", "slowhook", check=True)
    assert time.monotonic() - t0 < 10  # the 30 s hook is not waited for
    sup = h.state("slowhook")["supervisor"]
    wait_for(lambda: not Path(f"/proc/{sup['pid']}").exists(), 10, "the supervisor to exit")

    def failed() -> list[dict]:  # type: ignore[type-arg]
        return [e for e in h.events("slowhook") if e["event"] == "hook_failed"]

    wait_for(failed, 20, "the hook's timeout")
    [e] = failed()
    assert e["error"] == "timed out after 2 s; killed"
    assert e["output"] == "started\n"


def test_an_unreachable_webhook_is_one_event_and_the_job_goes_on(harness: Harness) -> None:
    h = harness
    url = f"http://127.0.0.1:{free_port()}/nobody"
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    h.tc(
        "start", "--name", "nowhere", "--set", f'notify="{url}"', "--set", "stall_timeout=1",
        "--", sys.executable, "-c", "import time; print('x', flush=True); time.sleep(600)",
        check=True,
    )  # fmt: skip

    def notify_failed() -> list[dict]:  # type: ignore[type-arg]
        return [e for e in h.events("nowhere") if e["event"] == "notify_failed"]

    wait_for(notify_failed, 30, "the stall notification to fail")
    time.sleep(1.5)
    [e] = notify_failed()  # once: never retried in a loop
    assert e["hook_event"] == "stall"
    assert "cannot reach 127.0.0.1" in e["error"]
    assert h.tc("status", "nowhere", "--json").json()["state"] == "running"  # type: ignore[index]
    h.tc("stop", "nowhere", check=True)


def test_on_stall_runs_once_per_stall(harness: Harness) -> None:
    h = harness
    hook = _hook(h)
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    h.tc(
        "start", "--name", "quiet", "--set", "stall_timeout=1", "--set", f'on_stall="{hook}"',
        "--", sys.executable, "-c", "import time; time.sleep(600)", check=True,
    )  # fmt: skip
    env_file = Path(f"{hook}.stall.env")
    wait_for(env_file.exists, 30, "the on_stall hook")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["TRAINCTL_CAUSE"] == "stalled"
    assert env["TRAINCTL_EXIT_CODE"] == ""
    time.sleep(4)
    seen = h.events("quiet")
    assert sum(e["event"] == "hook_ran" for e in seen) == 1, seen
    h.tc("stop", "quiet", check=True)


def test_on_checkpoint_stale_fires_when_the_newest_checkpoint_is_too_old(harness: Harness) -> None:
    h = harness
    hook = _hook(h)
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    (h.tmp / "ckpt").mkdir()
    (h.tmp / "ckpt" / "step-1.pt").write_text("x")
    h.tc(
        "start", "--name", "ck", "--cwd", str(h.tmp), "--set", 'checkpoint="ckpt/*.pt"',
        "--set", "checkpoint_stale=2", "--set", f'on_checkpoint_stale="{hook}"',
        "--", sys.executable, "-c", "import time; time.sleep(600)", check=True,
    )  # fmt: skip
    env_file = Path(f"{hook}.checkpoint_stale.env")
    wait_for(env_file.exists, 30, "the on_checkpoint_stale hook")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert env["TRAINCTL_CAUSE"] == "checkpoint_stale"
    assert "the newest checkpoint" in env["TRAINCTL_SUMMARY"]
    h.tc("stop", "ck", check=True)


def test_notify_carries_the_progress_a_job_reports_through_trainctl_progress(
    harness: Harness, receiver: Receiver
) -> None:
    """`trainer.report(step=…)` (the $TRAINCTL_PROGRESS lines) feeds notify's progress,
    not only `progress_regex` samples (it was always null for these jobs)."""
    h = harness
    code = (
        "import sys\n"
        "from trainctl.launcher import trainer\n"
        "for step in range(43):\n"
        "    trainer.report(step=step, loss=1.0 / (step + 1))\n"
        "sys.exit(1)\n"
    )
    h.tc(
        "start", "--name", "rep", "--set", "total_steps=100",
        "--set", f'notify="{receiver.url}"', "--", sys.executable, "-c", code, check=True,
    )  # fmt: skip
    h.tc("wait", "rep", "--timeout", "30")
    wait_for(lambda: receiver.docs, 20, "the notify document")
    [sent] = receiver.docs
    assert sent["event"] == "failure"
    assert sent["progress"] == {"step": 42, "total": 100}
