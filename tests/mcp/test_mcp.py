"""`trainctl mcp`, driven over stdio by the MCP SDK's own client, against real jobs."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import pytest

from tests.conftest import Harness, wait_for
from tests.helpers import one_line_error

mcp_client = pytest.importorskip(
    "mcp.client", reason="the MCP SDK (trainctl[mcp]) is not installed"
)
mcp_stdio = pytest.importorskip("mcp.client.stdio")

# Holds SIGTERM for 1.5 s (a checkpoint), then exits: the stop's grace shows as progress.
SLOW_EXIT = (
    "import signal, sys, time\n"
    "def bye(*_):\n"
    "    time.sleep(1.5)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('step 1 loss 0.5', flush=True)\n"
    "print('step 2 loss 0.4', flush=True)\n"
    "time.sleep(600)\n"
)


def _session(h: Harness, *args: str) -> Any:
    params = mcp_stdio.StdioServerParameters(
        command=sys.executable, args=["-m", "trainctl.launcher", "mcp", *args], env=h.env
    )
    return mcp_client.Client(params, read_timeout_seconds=60)


def _doc(result: Any) -> Any:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def _error(result: Any) -> str:
    assert result.is_error
    [text] = [c.text for c in result.content]
    assert "\n" not in text.strip()
    return str(text)


def _start(h: Harness, name: str) -> None:
    h.tc(
        "start", "--name", name, "--grace", "10", "--", sys.executable, "-c", SLOW_EXIT, check=True
    )
    wait_for(lambda: "step 2" in h.tc("logs", name).out, 20, "the job's output")


def test_read_only_tools_on_a_real_job_and_refusals(harness: Harness) -> None:
    h = harness
    _start(h, "train")

    async def talk() -> None:
        async with _session(h) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert names == {
                "list_jobs", "job_status", "job_ps", "job_logs", "gpus", "job_stack",
                "doctor", "plan_stop", "stop_job", "restart_job", "start_job",
                "job_history", "deploy_job", "job_report",
            }  # fmt: skip
            stop_tool = next(t for t in (await c.list_tools()).tools if t.name == "stop_job")
            assert "pkill" in (stop_tool.description or "")
            st = _doc(await c.call_tool("job_status", {"name": "train"}))
            cli = h.tc("status", "train", "--json").json()
            assert isinstance(cli, dict)
            assert (st["state"], st["run"], st["main_pid"]) == ("running", 1, cli["main_pid"])
            jobs = _doc(await c.call_tool("list_jobs", {}))
            assert [j["name"] for j in jobs] == ["train"]
            logs = _doc(await c.call_tool("job_logs", {"name": "train", "lines": 1}))
            assert logs["lines"] == ["step 2 loss 0.4"]
            assert logs["truncated"] is False
            ps = _doc(await c.call_tool("job_ps", {"name": "train"}))
            assert [r["pid"] for r in ps] == [cli["main_pid"]]
            plan = _doc(await c.call_tool("plan_stop", {"name": "train"}))
            assert plan["first"] == [cli["main_pid"]]
            assert plan["signal"] == "SIGTERM"
            assert plan["grace_s"] == 10
            # bad arguments: one line each, and the server keeps serving
            assert "no job named 'nosuch'" in _error(
                await c.call_tool("job_status", {"name": "nosuch"})
            )
            assert "lines must be 1..500" in _error(
                await c.call_tool("job_logs", {"name": "train", "lines": 501})
            )
            said = _error(await c.call_tool("stop_job", {"name": "train"}))
            assert "trainctl mcp --allow stop" in said
            said = _error(await c.call_tool("start_job", {"name": "x", "argv": ["true"]}))
            assert "--allow start" in said
            said = _error(await c.call_tool("deploy_job", {"name": "train"}))
            assert "--allow deploy" in said
            history = _doc(await c.call_tool("job_history", {"name": "train"}))
            assert [(r["run"], r["phase"]) for r in history] == [(1, None)]  # it runs
            report = _doc(await c.call_tool("job_report", {"name": "train"}))
            assert (report["runs"], report["running"]) == (1, True)
            assert _doc(await c.call_tool("job_status", {"name": "train"}))["state"] == "running"

    anyio.run(talk)
    assert h.tc("status", "train").rc == 0  # nothing was stopped
    assert h.job_pids("train")
    assert h.tc("stop", "train").rc == 0


def test_allow_stop_stops_the_job_with_progress_and_nothing_survives(harness: Harness) -> None:
    h = harness
    _start(h, "train")
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def talk() -> Any:
        async with _session(h, "--allow", "stop") as c:
            said = _error(await c.call_tool("restart_job", {"name": "train"}))
            assert "--allow restart" in said
            return _doc(
                await c.call_tool("stop_job", {"name": "train"}, progress_callback=progress)
            )

    report = anyio.run(talk)
    assert report["ok"] is True
    assert report["report"]["survivors"] == []
    assert h.job_pids("train") == {}  # the marker scan: 0 survivors
    assert h.state("train")["phase"] == "stopped"
    assert seen, "no progress while the job used its grace"
    assert any(m and "grace left" in m for _, _, m in seen)


def test_bad_allow_is_one_line_and_exit_2(harness: Harness) -> None:
    one_line_error(harness.tc("mcp", "--allow", "stop,kill"), 2, "kill is not one of")


def test_concurrent_calls_each_get_their_own_jobs_result(harness: Harness) -> None:
    """20 tool calls at once (status and logs of 4 jobs): the server runs each in a worker
    thread, and every result must be its own job's, never another call's document."""
    h = harness
    names = [f"j{i}" for i in range(4)]
    for name in names:
        code = f"print('i am {name}', flush=True)\nimport time\ntime.sleep(600)\n"
        h.tc("start", "--name", name, "--", sys.executable, "-c", code, check=True)
    for name in names:
        wait_for(lambda n=name: f"i am {n}" in h.tc("logs", n).out, 20, f"{name}'s output")
    calls = [(names[i % 4], "job_status" if i % 2 else "job_logs") for i in range(20)]

    async def talk() -> list[tuple[str, str, Any]]:
        got: list[tuple[str, str, Any]] = []
        async with _session(h) as c:

            async def one(name: str, tool: str) -> None:
                got.append((name, tool, _doc(await c.call_tool(tool, {"name": name}))))

            async with anyio.create_task_group() as tg:
                for name, tool in calls:
                    tg.start_soon(one, name, tool)
        return got

    results = anyio.run(talk)
    assert len(results) == 20
    for name, tool, doc in results:
        if tool == "job_status":
            assert doc["name"] == name, (name, doc)
        else:
            assert doc["lines"] == [f"i am {name}"], (name, doc)
    for name in names:
        assert h.tc("stop", name).rc == 0


@pytest.mark.parametrize(
    "name", ["../x", "..", "/etc/passwd", "other; kill -9 -1", "", "a" * 65, "nul\0byte"]
)
def test_every_tool_refuses_a_bad_name_with_one_line(harness: Harness, name: str) -> None:
    h = harness
    tools = ("job_status", "job_ps", "job_logs", "job_stack", "plan_stop", "stop_job",
             "restart_job", "job_history", "deploy_job", "job_report")  # fmt: skip

    async def talk() -> list[str]:
        async with _session(h, "--allow", "stop,restart,start,deploy") as c:
            said = [_error(await c.call_tool(t, {"name": name})) for t in tools]
            said.append(_error(await c.call_tool("start_job", {"name": name, "argv": ["true"]})))
            return said

    for line in anyio.run(talk):
        assert "invalid job name" in line, line
    assert not (h.home / "jobs").exists() or not list((h.home / "jobs").iterdir())


def test_allow_deploy_deploys_through_the_tool_and_history_shows_it(harness: Harness) -> None:
    from tests.keeper.test_deploy import repo, start, version  # noqa: PLC0415

    h = harness
    r = repo(h)
    start(h, "d", r)
    new = version(r, 2)

    async def talk() -> Any:
        async with _session(h, "--allow", "deploy") as c:
            rep = _doc(await c.call_tool("deploy_job", {"name": "d", "health": "30s"}))
            rows = _doc(await c.call_tool("job_history", {"name": "d"}))
            return rep, rows

    rep, rows = anyio.run(talk)
    assert rep["outcome"] == "deployed"
    assert rep["to_commit"] == new[:12]
    assert [r["commit"] for r in rows][-1] == new
    assert h.tc("stop", "d").rc == 0
