"""Every GPU promise through the real nvidia-ml-py and trainctl's own NVML backend.

No Python fake here: the real pynvml loads a C double of libnvidia-ml.so.1
(tests/gpu/nvml_double.c) through LD_LIBRARY_PATH, so supervisor/gpu/nvml.py runs for
real, and the pitfalls of real boxes (an old driver, a lost GPU, a version mismatch,
MIG, host pids, slow init, Xid events) are reproduced by the "driver" itself. The jobs
are real processes that keep the double's device nodes open, as CUDA processes keep
/dev/nvidiaN open.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Harness, Result, wait_for
from tests.gpu.nvml_double import GIB, MIB, Driver
from trainctl.supervisor.gpu import health

pytest.importorskip("pynvml")
HOLDERS = Path(__file__).parents[1] / "trees" / "gpu_holders.py"


def driver(h: Harness, n: int = 8, **kw: object) -> Driver:
    d = Driver(h.tmp, n, **kw)  # type: ignore[arg-type]
    h.env.pop("TRAINCTL_FAKE_GPU", None)
    h.env.update(d.env(), FAKE_GPU_MIB="2048")
    return d


def watched(h: Harness, name: str, timeout_s: float = 20) -> Path:
    """Wait until job ``name``'s supervisor watches its GPUs; its events.jsonl."""
    events = h.home / "jobs" / name / "events.jsonl"
    wait_for(lambda: '"event": "gpu_watch"' in events.read_text(), timeout_s, "the GPU watch")
    return events


def start_holders(h: Harness, name: str, gpus: str, *extra: str) -> Result:
    """The 4-holder job (main, child, escaped daemon, loader grandchild) on ``gpus``."""
    ready = h.ready_file(name)
    res = h.tc(
        "start", "--name", name, "--gpus", gpus, "--grace", "2", "--json",
        "--env", f"TREE_READY={ready}", *extra, "--", sys.executable, str(HOLDERS),
    )  # fmt: skip
    if res.rc == 0:
        wait_for(ready.exists, 30, "the GPU job to hold its GPUs")
    return res


def one_line(res: Result, rc: int, needle: str) -> None:
    assert res.rc == rc, res
    assert needle in res.err, res
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert "Traceback" not in res.out + res.err


def gpus_json(h: Harness) -> list[dict]:  # type: ignore[type-arg]
    doc = h.tc("gpus", "--json", check=True).json()
    assert isinstance(doc, list)
    return doc


def test_bind_lease_and_release_on_eight_gpus(harness: Harness) -> None:
    h = harness
    d = driver(h)
    res = start_holders(h, "big", "8")
    assert res.rc == 0, res
    assert res.json()["gpus"] == "0,1,2,3,4,5,6,7"  # type: ignore[index]
    leases = h.state("big")["gpus"]
    assert [g["uuid"] for g in leases] == [d.uuid(i) for i in range(8)]
    assert all(g["baseline_used_bytes"] == 512 * MIB for g in leases)
    rows = gpus_json(h)
    assert [r["leased_by"] for r in rows] == ["big"] * 8
    assert all(r["driver_version"] == "550.54.15" for r in rows)
    for r in rows:
        assert {p["owner"] for p in r["processes"]} == {"big"}
        assert len(r["processes"]) == 4  # main, child, the escaped daemon, the loader
        assert r["memory_used_bytes"] == 512 * MIB + 4 * 2048 * MIB
    clash = h.tc("start", "--name", "more", "--gpus", "1", "--", "true")
    one_line(clash, 1, "only 0 of 8 GPUs are free")
    stop = h.tc("stop", "big", "--json")
    assert stop.rc == 0, stop
    report = stop.json()["report"]  # type: ignore[index]
    assert report["survivors"] == []
    assert [g["ok"] for g in report["gpus"]] == [True] * 8
    assert all(g["released_bytes"] == 4 * 2048 * MIB for g in report["gpus"])
    assert all(r["leased_by"] is None and not r["processes"] for r in gpus_json(h))


def test_memory_that_lingers_three_seconds_is_waited_for(harness: Harness) -> None:
    h = harness
    d = driver(h, 2)
    d.device(1, release_delay_s=3)
    assert start_holders(h, "slow", "1,").rc == 0
    # the double learns a holder from a call that sees it alive (a real driver needs none)
    assert gpus_json(h)[1]["leased_by"] == "slow"
    stop = h.tc("stop", "slow")
    assert stop.rc == 0, stop
    line = next(x for x in stop.out.splitlines() if "GPU 1 " in x)
    seconds = float(re.search(r"after ([0-9.]+) s", line).group(1))  # type: ignore[union-attr]
    assert 2.5 <= seconds < 15, line  # it waited for the driver, and says how long
    assert "released 8.0 GiB" in line


def test_stuck_memory_is_never_claimed_released(harness: Harness) -> None:
    h = harness
    d = driver(h, 2)
    d.device(0, stuck=True)
    assert start_holders(h, "leak", "0,").rc == 0
    assert len(gpus_json(h)[0]["processes"]) == 4  # seen alive (the double remembers them)
    stop = h.tc("stop", "leak", "--gpu-timeout", "1", "--json")
    assert stop.rc == 1, stop
    report = stop.json()["report"]  # type: ignore[index]
    assert report["survivors"] == []  # every process is gone: only the memory stays
    [g] = report["gpus"]
    assert g["ok"] is False
    assert g["error"] is None  # checked, and found held: not "not verified"
    assert g["excess_bytes"] == 4 * 2048 * MIB
    assert "NVML lists no process" in g["note"]
    human = h.tc("stop", "leak", "--gpu-timeout", "1")  # the stopped job's GPU, checked again
    assert "GPU 0  NOT RELEASED" in human.out
    # a holder NVML names but this PID namespace cannot see is named as such
    d.device(0, processes=[{"pid": 4194000, "used": 3 * GIB, "host": True}])
    again = h.tc("stop", "leak", "--gpu-timeout", "1")
    assert "pid 4194000 (not visible here)" in again.out, again.out
    assert "(not visible here) (not visible here)" not in again.out


def test_host_pids_in_a_container_are_shown_never_trusted(harness: Harness) -> None:
    """NVML lists host pids (absent here) and the sentinel pid; the job's release is
    proven by memory, and nothing is signalled or attributed on NVML's word."""
    h = harness
    d = driver(h, 2)
    d.device(
        0,
        processes=[
            {"pid": 4194001, "used": 1 * GIB, "host": True},
            {"pid": 4294967295, "used": -1, "host": True},  # library/driver disagree
        ],
    )
    g0 = gpus_json(h)[0]
    assert [(p["pid"], p["owner"]) for p in g0["processes"]] == [(4194001, "not visible here")]
    assert "4294967295" not in h.tc("gpus", check=True).out
    # a job on GPU 1 next to it: bound, stopped, proven released
    assert start_holders(h, "ct", "1,").rc == 0
    assert h.tc("stop", "ct").rc == 0


def test_one_lost_gpu_of_eight_leaves_the_others_working(harness: Harness) -> None:
    h = harness
    d = driver(h)
    assert start_holders(h, "pair", "2,3").rc == 0
    d.device(3, lost=True)  # Xid 79: GPU 3 fell off the bus while the job runs
    view = h.tc("gpus")
    assert view.rc == 0, view
    assert "GPU 3  ERROR: GPU 3 lost (Xid 79?)" in view.out
    assert view.out.count("NVIDIA H200") == 7
    rows = gpus_json(h)
    assert rows[3]["error"].startswith("GPU 3 lost")
    assert rows[2]["leased_by"] == "pair"
    two = h.tc("start", "--name", "two", "--gpus", "2", "--json", "--", "sleep", "600")
    assert two.rc == 0, two
    assert two.json()["gpus"] == "0,1"  # type: ignore[index]
    on_lost = h.tc("start", "--name", "bad", "--gpus", "3,", "--", "sleep", "600")
    one_line(on_lost, 1, "GPU 3 lost")
    top = h.tc("top", "--once")
    assert top.rc == 0, top
    dry = h.tc("stop", "pair", "--dry-run")
    assert dry.rc == 0, dry
    stop = h.tc("stop", "pair", "--json")
    report = stop.json()["report"]  # type: ignore[index]
    assert report["survivors"] == []  # the processes first, whatever the GPU says
    by_index = {g["index"]: g for g in report["gpus"]}
    assert by_index[2]["ok"] is True  # the healthy GPU is proven released
    assert by_index[3]["ok"] is False
    assert "GPU 3 lost" in by_index[3]["error"]
    human = h.tc("stop", "pair")
    assert "GPU 3  not verified: GPU 3 lost" in human.out
    assert "NOT released" not in human.out
    assert h.tc("stop", "two").rc == 0


def test_a_version_mismatch_gets_its_cause_and_fix(harness: Harness) -> None:
    h = harness
    d = driver(h, 2)
    assert start_holders(h, "run", "0,").rc == 0
    d.set(init_error="LIB_RM_VERSION_MISMATCH")  # the host driver was updated meanwhile
    view = h.tc("gpus")
    one_line(view, 1, "version mismatch")
    assert "reboot or reload" in view.err
    assert "container" in view.err
    doc = h.tc("gpus", "--json")
    assert doc.rc == 1
    assert "version mismatch" in doc.json()["error"]  # type: ignore[index]
    start = h.tc("start", "--name", "g", "--gpus", "1", "--", "sleep", "1")
    one_line(start, 1, "version mismatch")
    plain = h.tc("start", "--name", "plain", "--", "sleep", "600")
    assert plain.rc == 0, plain  # jobs without --gpus never ask the driver
    for verb in (["ps", "plain"], ["top", "--once"], ["status", "plain"]):
        res = h.tc(*verb)
        assert res.rc == 0, (verb, res)
    assert h.tc("stop", "plain").rc == 0
    stop = h.tc("stop", "run")
    assert "nothing of the job is alive" in stop.out, stop
    # The supervisor's NVML session may predate the mismatch (its GPU watch initialises
    # soon after the start, racing the test's d.set): a live session keeps answering, as
    # on a real host whose driver was updated under it. Either way the stop tells the
    # truth: not verified, or verified released; never a false "NOT released".
    assert "not verified" in stop.out or "GPUs released" in stop.out, stop.out
    assert "NOT released" not in stop.out
    assert not h.job_pids("run")


def test_no_permission_is_not_no_driver(harness: Harness) -> None:
    h = harness
    d = driver(h, 1)
    d.set(init_error="NO_PERMISSION")
    view = h.tc("gpus")
    one_line(view, 1, "no permission to read the GPUs")
    assert "no NVIDIA driver" not in view.err


@pytest.mark.parametrize("missing_v2", [False, True])
def test_a_driver_without_the_v3_calls(harness: Harness, missing_v2: bool) -> None:
    """An older driver than the library: _v2 instead, or release by memory alone."""
    h = harness
    d = driver(h, 2, old_driver=True)
    if missing_v2:
        d.set(fail={"nvmlDeviceGetComputeRunningProcesses_v2": "FUNCTION_NOT_FOUND"})
    assert start_holders(h, "old", "0,").rc == 0
    for verb in (["gpus"], ["ps", "old"], ["top", "--once"], ["stop", "old", "--dry-run"]):
        res = h.tc(*verb)
        assert res.rc == 0, (verb, res)
        assert "Traceback" not in res.err
    g0 = gpus_json(h)[0]
    assert g0["leased_by"] == "old"
    assert {p["seen"] for p in g0["processes"]} == ({"fd"} if missing_v2 else {"nvml+fd"})
    stop = h.tc("stop", "old", "--json")
    assert stop.rc == 0, stop
    [g] = stop.json()["report"]["gpus"]  # type: ignore[index]
    assert g["ok"] is True
    if missing_v2:
        assert "process list not available with this driver" in g["note"]
        assert "process list not available" in h.tc("gpus").err


def test_a_process_list_not_supported_on_one_gpu(harness: Harness) -> None:
    h = harness
    d = driver(h, 3)
    d.device(1, fail={"nvmlDeviceGetComputeRunningProcesses_v3": "NOT_SUPPORTED"})
    view = h.tc("gpus")
    assert view.rc == 0, view
    res = h.tc("start", "--name", "two", "--gpus", "2", "--json", "--", "sleep", "600")
    assert res.rc == 0, res
    assert h.tc("stop", "two").rc == 0


def test_graphics_and_mps_processes_are_holders(harness: Harness) -> None:
    h = harness
    d = driver(h, 1)
    # a display server of our own, say: a process NVML lists as graphics on GPU 0
    me = subprocess.Popen(["sleep", "600"], env={**h.env, "TCTEST_BYSTANDER": "1"})
    h.bystanders.append(me)
    d.device(0, processes=[{"pid": me.pid, "used": 4 * GIB, "kind": "graphics"}])
    refused = h.tc("start", "--name", "x", "--gpus", "0,", "--", "true")
    one_line(refused, 1, "outside any job")
    [p] = gpus_json(h)[0]["processes"]
    assert p["pid"] == me.pid
    assert "graphics" in p["seen"]


def test_mig_two_instances_and_a_job_on_one(harness: Harness) -> None:
    h = harness
    d = driver(h, 2)
    uuids = [f"MIG-5e1f0c3a-0000-4000-8000-00000000000{k}" for k in range(2)]
    mig = [
        {"uuid": u, "total": 70 * GIB, "used": 64 * MIB, "gi": k + 1, "node": str(d.dev / u)}
        for k, u in enumerate(uuids)
    ]
    for m in mig:
        Path(m["node"]).touch()
    d.device(0, mig=mig)
    rows = gpus_json(h)
    assert [(r["label"], r["mig_mode"]) for r in rows[:3]] == [
        ("0", True), ("0/0", None), ("0/1", None)
    ]  # fmt: skip
    whole = h.tc("start", "--name", "w", "--gpus", "0,", "--", "true")
    one_line(whole, 2, "GPU 0 is in MIG mode")
    unknown = h.tc("start", "--name", "u", "--gpus", "MIG-00000000-dead", "--", "true")
    one_line(unknown, 2, "no GPU 'MIG-00000000-dead'")
    assert not (h.home / "jobs" / "u").exists()
    res = start_holders(h, "m1", mig[1]["uuid"])
    assert res.rc == 0, res
    [lease] = h.state("m1")["gpus"]
    assert (lease["index"], lease["mig"], lease["uuid"]) == (0, 1, mig[1]["uuid"])
    env = (Path("/proc") / str(h.state("m1")["main"]["pid"]) / "environ").read_bytes()
    assert f"CUDA_VISIBLE_DEVICES={mig[1]['uuid']}".encode() in env.split(b"\0")
    rows = gpus_json(h)
    assert rows[2]["leased_by"] == "m1"
    assert rows[2]["memory_used_bytes"] == 64 * MIB + 4 * 2048 * MIB
    assert rows[1]["leased_by"] is None
    other = h.tc("start", "--name", "m0", "--gpus", "0/0", "--json", "--", "sleep", "600")
    assert other.rc == 0, other  # the other instance is free
    taken = h.tc("start", "--name", "m2", "--gpus", "0/1", "--", "sleep", "600")
    one_line(taken, 1, "GPU 0/1 is leased by job m1")
    stop = h.tc("stop", "m1", "--json")
    assert stop.rc == 0, stop
    [g] = stop.json()["report"]["gpus"]  # type: ignore[index]
    assert (g["ok"], g["mig"], g["released_bytes"]) == (True, 1, 4 * 2048 * MIB)
    assert h.tc("stop", "m0").rc == 0


def test_an_application_xid_is_recorded_and_leaves_the_run_alone(harness: Harness) -> None:
    """Issue 47 §1: classed by NVIDIA's action table: Xid 13 is the application's (restart
    the application: the run's own crash counts toward the restart policy); an Xid the
    table does not hold is shown with its number, never guessed at or acted on."""
    h = harness
    d = driver(h, 4)
    gate = h.tmp / "die"
    res = h.tc(
        "start", "--name", "x", "--gpus", "2,", "--", "sh", "-c",
        f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 1",
    )  # fmt: skip
    assert res.rc == 0, res
    events = watched(h, "x")
    d.device(2, xids=[13])
    wait_for(lambda: "Xid 13" in h.tc("status", "x").out, 20, "status to show the Xid")
    assert (
        "GPU 2 Xid 13 (graphics engine exception; restart the application)"
        in h.tc("status", "x").out
    )
    d.device(2, xids=[13, 999])
    wait_for(lambda: "Xid 999" in h.tc("status", "x").out, 20, "the unknown Xid")
    assert "not in NVIDIA's catalog here: not acted on" in h.tc("status", "x").out
    doc = [json.loads(x) for x in events.read_text().splitlines()]
    faults = [e for e in doc if e["event"] == "gpu_fault"]
    assert [(e["xid"], e["klass"]) for e in faults] == [(13, "restart-app"), (999, "unknown")]
    # Issue 47 "bad input and faults": an Xid on a GPU no job holds is recorded and shown
    # in `gpus` (seen by the watch of this run, which holds another GPU); no job is touched
    d.device(0, xids=[79])
    d.device(1, xids=[13])
    wait_for(lambda: "UNHEALTHY: Xid 79" in h.tc("gpus").out, 20, "GPU 0 marked unhealthy")
    wait_for(lambda: "last fault: Xid 13" in h.tc("gpus").out, 20, "GPU 1's fault in gpus")
    listing = h.tc("gpus").out
    assert re.search(r"GPU 0  UNHEALTHY: Xid 79 at \d\d:\d\d \(reboot needed\)", listing)
    assert re.search(
        r"last fault: Xid 13 at \d\d:\d\d \(restart the application; no run held it\)", listing
    ), listing
    rows = gpus_json(h)
    assert rows[2]["last_fault"].endswith("(not in NVIDIA's catalog here: not acted on; in run x)")
    assert rows[2]["unhealthy"] is None
    assert h.state("x")["phase"] == "running"  # none of it stopped the run
    gate.touch()
    h.tc("wait", "x", "--timeout", "30")
    cause = h.tc("status", "x", "--json").json()["cause"]  # type: ignore[index]
    assert re.match(r"GPU 2 Xid 999 .* at \d\d:\d\d:\d\d, then ", cause["summary"]), cause
    assert "GPU 0" not in h.tc("status", "x").out
    assert "GPU 1" not in h.tc("status", "x").out
    # recorded once although the watch saw it (and the file is one entry a GPU)
    box = json.loads((h.home / "gpu-faults.json").read_text())
    assert sorted(box) == ["0", "1", "2"]
    # whose a GPU is, for a fault another run's watch sees: the run that leases it now
    h.tc("start", "--name", "y", "--gpus", "3,", "--", "sleep", "600", check=True)
    assert health.holder_of(h.home, 3) == "y"
    assert health.holder_of(h.home, 1) is None
    assert h.tc("stop", "y").rc == 0
    assert health.holder_of(h.home, 3) is None
    assert box["0"]["job"] is None
    assert box["2"]["job"] == "x"


def test_the_drivers_recovery_action_classes_a_fault_over_the_table(harness: Harness) -> None:
    """Issue 47 §1: NVML's GPU recovery action, where the driver reports one, over the Xid
    table: Xid 13 (the application's) with the driver asking for a GPU reset makes the GPU
    unhealthy and stops the run (a recovery action alone: the ECC test below)."""
    h = harness
    d = driver(h, 4)
    res = h.tc("start", "--name", "r", "--gpus", "1,2", "--grace", "2", "--", "sleep", "600")
    assert res.rc == 0, res
    events = watched(h, "r")
    d.device(2, recovery_action=1, xids=[13])
    wait_for(lambda: h.state("r")["phase"] == "failed", 30, "the run to be stopped")
    cause = h.state("r")["cause"]["summary"]
    assert cause.startswith("GPU 2 lost (Xid 13: GPU reset needed); "), cause
    faults = [json.loads(x) for x in events.read_text().splitlines() if '"gpu_fault"' in x]
    [f] = faults
    assert (f["xid"], f["klass"]) == (13, "reset-gpu")
    assert "the driver asks for a GPU reset" in f["fault"]
    assert "UNHEALTHY: Xid 13" in h.tc("gpus").out


def test_a_lost_gpu_stops_the_run_and_is_handed_to_no_run_until_cleared(
    harness: Harness,
) -> None:
    """Issue 47 §2-§3: Xid 79 on a leased GPU: the run is stopped at once with the cause
    and the way on; the GPU is unhealthy in `gpus` and no start is handed it until
    `gpus --clear`."""
    h = harness
    d = driver(h, 4)
    res = h.tc("start", "--name", "big", "--gpus", "1,2", "--grace", "2", "--", "sleep", "600")
    assert res.rc == 0, res
    watched(h, "big")
    d.device(2, xids=[79])
    wait_for(lambda: h.state("big")["phase"] == "failed", 30, "the run to be stopped")
    cause = h.state("big")["cause"]
    assert cause["kind"] == "gpu", cause
    assert cause["summary"].startswith("GPU 2 lost (Xid 79: reboot needed); "), cause
    assert "trainctl start big --gpus 1," in cause["summary"]
    assert not h.job_pids("big")
    listing = h.tc("gpus", check=True).out
    assert re.search(r"GPU 2  UNHEALTHY: Xid 79 at \d\d:\d\d \(reboot needed\)", listing)
    doc = h.tc("gpus", "--json", check=True).json()
    [two] = [g for g in doc if g["index"] == 2]  # type: ignore[union-attr, index]
    assert two["unhealthy"].startswith("unhealthy: Xid 79")
    refused = h.tc("start", "--name", "next", "--gpus", "2,", "--", "sleep", "600")
    assert refused.rc == 1
    assert "GPU 2 is unhealthy: Xid 79" in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    counted = h.tc("start", "--name", "any", "--gpus", "4", "--", "sleep", "600")
    assert counted.rc == 1  # 3 healthy of 4
    assert "unhealthy" in counted.err
    assert h.tc("gpus", "--clear", "2", check=True).out.startswith("GPU 2 is marked healthy")
    assert h.tc("gpus", "--clear", "2", check=True).out.startswith("GPU 2 was not marked")
    assert h.tc("gpus", "--clear", "-1").rc == 2
    d.device(2, xids=[])
    h.tc("start", "--name", "next", "--gpus", "2,", "--", "sleep", "600", check=True)
    assert h.tc("stop", "next").rc == 0


def test_a_watch_that_cannot_read_the_driver_says_so_and_tries_again(harness: Harness) -> None:
    """Issue 47 "bad input and faults": the supervisor's own NVML init fails (a GPU lost,
    a library mismatch) while the launcher's worked. The run is never left without a
    verdict: its GPU faults say the watch is blind and why, a failed end's cause leads
    with it, and the watch tries again and sees once the driver answers."""
    h = harness
    d = driver(h, 2)
    d.set(init_error="GPU_IS_LOST", init_error_in="trainctl.supervisor")
    gate = h.tmp / "die"
    res = h.tc(
        "start", "--name", "b", "--gpus", "1,", "--", "sh", "-c",
        f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 1",
    )  # fmt: skip
    assert res.rc == 0, res  # the launcher's own look at the GPUs worked
    wait_for(lambda: h.state("b")["gpu_faults"], 20, "the blind watch to be said")
    [blind] = h.state("b")["gpu_faults"]
    assert re.match(r"GPU watch blind since \d\d:\d\d:\d\d: GPU \? lost \(Xid 79\?\)", blind), blind
    assert blind.endswith("; this run's GPU faults go unseen")
    assert f"GPU FAULT {blind}" in h.tc("status", "b").out
    gate.touch()
    h.tc("wait", "b", "--timeout", "30")
    cause = h.state("b")["cause"]["summary"]
    assert cause.startswith(f"{blind}, then "), cause
    # the driver answers again: the next try sees, and the blind line goes
    h.tc("start", "--name", "c", "--gpus", "1,", "--", "sleep", "600", check=True)
    wait_for(lambda: h.state("c")["gpu_faults"], 20, "the blind watch to be said")
    d.set(init_error=None)
    events = h.home / "jobs" / "c" / "events.jsonl"
    wait_for(lambda: '"event": "gpu_watch"' in events.read_text(), 30, "the watch to see")
    wait_for(lambda: not h.state("c")["gpu_faults"], 10, "the blind line to go")
    assert h.tc("stop", "c").rc == 0


def test_a_one_second_init_is_paid_once_and_never_before_the_signal(harness: Harness) -> None:
    h = harness
    d = driver(h, 8)
    assert start_holders(h, "slow", "8").rc == 0
    watched(h, "slow")
    d.set(init_delay_s=1.0)
    before = d.inits()
    stop = h.tc("stop", "slow", "--json")
    assert stop.rc == 0, stop
    report = stop.json()["report"]  # type: ignore[index]
    assert all(g["ok"] for g in report["gpus"])
    # the supervisor's release check reuses its open NVML: no init at all on the stop
    assert d.inits() == before


def test_gpus_and_doctor_show_versions_modes_and_warn_without_persistence(
    harness: Harness,
) -> None:
    h = harness
    d = driver(h, 3)
    d.device(1, persistence=0)
    d.device(2, mig=[{"uuid": "MIG-aaaaaaaa-0000-4000-8000-000000000000", "total": 35 * GIB}])
    view = h.tc("gpus")
    assert view.rc == 0, view
    assert view.out.startswith("driver 550.54.15  NVML 12.550.54.15")
    assert "GPU 1  NVIDIA H200" in view.out
    assert "persistence off" in view.out.splitlines()[2]
    assert "MIG mode" in view.out
    assert "GPU 2/0" in view.out
    assert "persistence mode is off on GPU(s) 1" in view.err
    # idle GPUs with the driver's reserved memory get no "PID namespace" note
    assert "no process listed" not in view.out
    rows = gpus_json(h)
    assert [r["persistence"] for r in rows[:3]] == [True, False, True]
    doctor = h.tc("doctor")
    assert "driver 550.54.15, NVML 12.550.54.15, 3 GPU(s)" in doctor.out, doctor
    assert "persistence OFF" in doctor.out
    assert "nvidia-smi -pm 1" in doctor.out
    assert "MIG on (1 instance(s)" in doctor.out
    d.device(0, lost=True)
    assert "GPU 0 lost (Xid 79?)" in h.tc("doctor").out


def test_the_watch_reads_uncorrected_ecc_errors_and_recovery_actions(harness: Harness) -> None:
    """The supervisor's GPU watch, through the real pynvml: a new ECC error is a fault, and
    so is a recovery action the driver newly asks for."""
    h = harness
    d = driver(h, 2)
    code = (
        "import json, sys\n"
        "from trainctl.supervisor.gpu.watch import GpuWatch\n"
        "from trainctl.supervisor.model.state import GpuLease\n"
        "w = GpuWatch.open((GpuLease(1, sys.argv[1], 'NVIDIA H200', 0),))\n"
        "first = w.sample()\n"
        "doc = json.load(open(sys.argv[2]))\n"
        "doc['devices'][1]['ecc_uncorrected'] = 2\n"
        "doc['devices'][0]['recovery_action'] = 2\n"
        "doc['devices'][1]['recovery_action'] = 99\n"
        "json.dump(doc, open(sys.argv[2], 'w'))\n"
        "def show(faults): return [f if isinstance(f, str) else repr(f) for f in faults]\n"
        "print(json.dumps([show(first), show(w.sample()), show(w.sample()), w.xids is not None]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, d.uuid(1), str(d.path)],
        env={**h.env, "TCTEST_BYSTANDER": "1"}, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    first, second, third, has_events = json.loads(out.stdout)
    assert first == []
    # the driver's recovery action, on every whole GPU of the box (GPU 0 is no lease of
    # this watch: the supervisor routes it); an action the table does not know keeps its
    # number, never guessed
    assert second[:2] == [
        "Fault(gpu=0, xid=None, klass='reboot', what='the driver asks for a reboot')",
        "Fault(gpu=1, xid=None, klass='unknown', what='the driver reports recovery action 99')",
    ], second
    assert second[2].startswith("GPU 1: 2 uncorrected ECC error(s) at ")
    assert third == []  # said once
    assert has_events


def test_gpu_smoke_script_passes_against_the_double(harness: Harness) -> None:
    """scripts/gpu_smoke.sh, unchanged on a real GPU, in its --double mode here."""
    h = harness
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the libnvidia-ml double")
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in h.env.items() if k not in ("TRAINCTL_HOME", "TRAINCTL_FAKE_GPU")}
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    script = Path(__file__).parents[2] / "scripts" / "gpu_smoke.sh"
    res = subprocess.run(
        ["bash", str(script), "--double", "1"], env=env, capture_output=True, text=True,
        timeout=100, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "== 0 check(s) failed" in res.stdout
    assert res.stdout.count("PASS ") == 6


def test_a_stuck_process_of_the_job_is_named_as_the_jobs_holder(
    harness: Harness, v1_freezer: Path
) -> None:
    """A member that cannot die (frozen: state D) still holds its GPU: the report names it
    as this job's, with its command, and never claims the GPU released."""
    h = harness
    d = driver(h, 1)
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[stop]\nkill_wait_s = 0.5\n")
    res = h.tc(
        "start", "--name", "fz", "--gpus", "0,", "--grace", "0.2", "--", "sh", "-c",
        f"exec 3<{d.dev}/nvidia0; exec sleep 600",
    )  # fmt: skip
    assert res.rc == 0, res
    main = h.state("fz")["main"]["pid"]
    wait_for(lambda: len(gpus_json(h)[0]["processes"]) == 1, 20, "the job to hold GPU 0")
    (v1_freezer / "cgroup.procs").write_text(str(main))
    (v1_freezer / "freezer.state").write_text("FROZEN")
    wait_for(lambda: (v1_freezer / "freezer.state").read_text().strip() == "FROZEN")
    stop = h.tc("stop", "fz", "--gpu-timeout", "1", "--json")
    assert stop.rc == 1, stop
    [g] = stop.json()["report"]["gpus"]  # type: ignore[index]
    assert g["ok"] is False
    assert [(x["pid"], x["owner"]) for x in g["job_holders"]] == [(main, "this job")]
    human = h.tc("stop", "fz", "--gpu-timeout", "1")
    assert f"pid {main} (this job) sleep 600" in human.out, human.out


def test_a_fault_on_a_gpu_no_run_holds_is_seen_by_the_boxs_own_look(harness: Harness) -> None:
    """issue 56 §6: with no run on any GPU there is no run's watch; the box's own look,
    made by each command that reads the GPUs (`gpus`, a start's choice, the queue's
    dispatch), finds what the driver says now: a GPU it has lost, one whose recovery
    action asks for a reboot. Each is marked unhealthy (no run of the home's) and
    handed to no run; a --clear holds only once the driver says the GPU is well."""
    h = harness
    d = driver(h, 4)
    d.device(1, recovery_action=2)  # the driver asks for a reboot of GPU 1: nothing on it
    d.device(3, lost=True)  # GPU 3 fell off the bus, idle
    assert health.unhealthy(h.home) == {}  # nothing watched: nothing known yet
    view = h.tc("gpus")
    assert view.rc == 0, view
    assert "GPU 1  UNHEALTHY" in view.out, view.out
    assert "the driver asks for a reboot" in view.out, view.out
    sick = health.unhealthy(h.home)
    assert set(sick) == {1, 3}, sick
    assert sick[1].job is None
    assert sick[1].klass == sick[3].klass == "reboot"
    assert health.last_faults(h.home)[1].job is None  # `gpus` says: no run held it
    # a start is handed the healthy ones; a GPU named is refused with its fault
    two = h.tc("start", "--name", "two", "--gpus", "2", "--json", "--", "sleep", "600")
    assert two.rc == 0, two
    assert two.json()["gpus"] == "0,2"  # type: ignore[index]
    one_line(h.tc("start", "--name", "on1", "--gpus", "1,", "--", "sleep", "600"), 1, "GPU 1")
    # the queue: a job that needs a GPU waits, and says which are out and why
    q = h.tc("start", "--name", "q", "--gpus", "1", "--queue", "--", "sleep", "600")
    assert q.rc == 0, q
    wait_for(lambda: "GPU 1" in h.tc("status", "q").out, 20, "the queue's reason")
    assert "reboot" in h.tc("status", "q").out
    # a person clears GPU 1 while the driver still asks for a reboot: the next look
    # marks it again; once the driver says it is well, the clear holds
    assert h.tc("gpus", "--clear", "1").rc == 0
    assert "GPU 1  UNHEALTHY" in h.tc("gpus").out  # looked again: the driver still asks
    assert 1 in health.unhealthy(h.home)
    d.device(1, recovery_action=0)
    assert h.tc("gpus", "--clear", "1").rc == 0
    assert "GPU 1  UNHEALTHY" not in h.tc("gpus").out
    assert 1 not in health.unhealthy(h.home)
    wait_for(lambda: h.tc("status", "q").rc == 0, 20, "the queued job on GPU 1")
    assert h.tc("stop", "q").rc == 0
    assert h.tc("stop", "two").rc == 0
