"""GPU bindings, leases, ownership and release proofs, with the fake GPU backend.

The fake is selected explicitly (TRAINCTL_FAKE_GPU) and its "GPU processes" are real
processes holding a marker file that stands in for /dev/nvidiaN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness, Result, wait_for
from tests.gpu.nvml_double import MIB, document
from trainctl.launcher import gpus as gpus_mod
from trainctl.supervisor.model.reports import GpuHolder
from trainctl.supervisor.records import replace

GIB = 1 << 30


def fake_gpus(h: Harness, n: int = 4, **overrides: Any) -> Path:
    """Describe n fake GPUs (overrides apply to every GPU) and select the fake backend."""
    dev = h.tmp / "dev"
    doc = document(dev, n)  # the one schema of both driver fakes (tests/gpu/nvml_double.py)
    for i, g in enumerate(doc["devices"]):
        g.update(uuid=f"GPU-fake-{i:04d}", name="Fake H200", total=143771 * MIB,
                 used=300 * MIB, **overrides)  # fmt: skip
    path = h.tmp / "gpus.json"
    path.write_text(json.dumps(doc))
    h.env.update(TRAINCTL_FAKE_GPU=str(path), FAKE_DEV_DIR=str(dev), FAKE_GPU_MIB="2048")
    return path


def set_gpu_option(path: Path, **options: Any) -> None:
    doc = json.loads(path.read_text())
    for g in doc["devices"]:
        g.update(options)
    path.write_text(json.dumps(doc))


def holder(
    h: Harness, index: int, mib: int = 2048, marker: str | None = None
) -> subprocess.Popen[bytes]:
    """A process outside trainctl holding fake GPU ``index`` (a bystander: we started it)."""
    ready = h.tmp / f"holder-{len(h.bystanders)}.ready"
    env = {**h.env, "TCTEST_BYSTANDER": "1", "FAKE_GPU_MIB": str(mib)}
    if marker:
        env["TRAINCTL_JOB"] = marker
    code = (
        f"import os,time\nfd=os.open({h.env['FAKE_DEV_DIR']!r}+'/nvidia{index}',os.O_RDWR)\n"
        f"open({str(ready)!r},'w').close()\ntime.sleep(600)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    h.bystanders.append(p)
    wait_for(ready.exists, what="GPU holder")
    return p


def start_gpu_job(h: Harness, name: str, gpus: str, *extra: str, grace: float = 1) -> Result:
    ready = h.ready_file(name)
    res = h.tc(
        "start",
        "--name",
        name,
        "--gpus",
        gpus,
        "--grace",
        str(grace),
        "--json",
        "--env",
        f"TREE_READY={ready}",
        *extra,
        "--",
        sys.executable,
        str(Path(__file__).parents[1] / "trees" / "gpu_holders.py"),
    )
    if res.rc == 0:
        wait_for(ready.exists, what="GPU job ready")
    return res


def gpus_json(h: Harness) -> list[dict[str, Any]]:
    res = h.tc("gpus", "--json", check=True)
    doc = res.json()
    assert isinstance(doc, list)
    return doc


def test_binding_env_and_state(harness: Harness) -> None:
    h = harness
    fake_gpus(h)
    out = h.tmp / "env.txt"
    res = h.tc(
        "start",
        "--name",
        "b",
        "--gpus",
        "1,GPU-fake-0003",
        "--json",
        "--",
        "sh",
        "-c",
        f"env > {out}.tmp; mv {out}.tmp {out}; sleep 600",
        check=True,
    )
    assert res.json()["gpus"] == "1,3"  # type: ignore[index]
    wait_for(out.exists)
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    leases = h.state("b")["gpus"]
    assert [(g["index"], g["uuid"], g["name"]) for g in leases] == [
        (1, "GPU-fake-0001", "Fake H200"),
        (3, "GPU-fake-0003", "Fake H200"),
    ]
    assert all(g["baseline_used_bytes"] == 300 << 20 for g in leases)
    assert h.tc("status", "b", "--json").json()["gpus"] == [1, 3]  # type: ignore[index]
    count = h.tc("start", "--name", "c", "--gpus", "2", "--json", "--", "sleep", "600", check=True)
    assert count.json()["gpus"] == "0,2"  # type: ignore[index]  # the free ones
    full = h.tc("start", "--name", "d", "--gpus", "1", "--", "sleep", "600")
    assert full.rc == 1
    assert "only 0 of 4 GPUs are free" in full.err
    h.tc("stop", "b", check=True)
    h.tc("stop", "c", check=True)
    zero = h.tc("start", "--name", "z", "--gpus", "0", "--json", "--", "sleep", "600")
    assert zero.json()["gpus"] == "0"  # type: ignore[index]  # "0" is GPU 0, not a count
    h.tc("stop", "z", check=True)
    nobind = h.tc(
        "start",
        "--name",
        "e",
        "--",
        "sh",
        "-c",
        f"env > {out}.2; sleep 600",
        env={**h.env, "CUDA_VISIBLE_DEVICES": "7"},
        check=True,
    )
    assert nobind.rc == 0
    wait_for(lambda: Path(f"{out}.2").exists())
    assert "CUDA_VISIBLE_DEVICES=7" in Path(f"{out}.2").read_text()  # left as it was
    assert h.state("e")["gpus"] == []
    h.tc("stop", "e", check=True)


def test_leases_and_refusals(harness: Harness) -> None:
    h = harness
    fake_gpus(h)
    h.tc("start", "--name", "a", "--gpus", "0,", "--", "sleep", "600", check=True)
    clash = h.tc("start", "--name", "b", "--gpus", "0,", "--", "sleep", "600")
    assert clash.rc == 1
    assert "GPU 0 is leased by job a" in clash.err
    assert len(clash.err.strip().splitlines()) == 1
    assert not (h.home / "jobs" / "b").exists()
    h.tc("start", "--name", "b", "--gpus", "0,", "--share", "--", "sleep", "600", check=True)
    foreign = holder(h, 1, mib=4096)
    refused = h.tc("start", "--name", "c", "--gpus", "1,", "--", "sleep", "600")
    assert refused.rc == 1
    assert f"pid {foreign.pid} (foreign)" in refused.err
    assert "--force" in refused.err
    h.tc("start", "--name", "c", "--gpus", "1,", "--force", "--", "sleep", "600", check=True)
    for bad, needle in (
        (["--gpus", "9,"], "no GPU '9'"),
        (["--gpus", "-1"], "no GPU '-1'"),
        (["--gpus", ",,"], "cannot parse"),
        (["--share"], "only make sense"),
    ):
        res = h.tc("start", "--name", "x", *bad, "--", "true")
        assert res.rc != 0
        assert needle in res.err
    for name in ("a", "b", "c"):
        h.tc("stop", name, check=True)


def test_gpus_view_attributes_job_foreign_and_orphan(harness: Harness) -> None:
    h = harness
    fake_gpus(h)
    start_gpu_job(h, "train", "0,")
    h.tc("start", "--name", "old", "--", "true", check=True)
    h.tc("wait", "old", "--timeout", "30")
    old_marker = h.state("old")["marker"]
    holder(h, 1, mib=1024)
    holder(h, 2, mib=1024, marker=old_marker)
    holder(h, 3, mib=1024, marker="f" * 32)
    by_index = {g["index"]: g for g in gpus_json(h)}
    owners0 = {p["owner"] for p in by_index[0]["processes"]}
    assert owners0 == {"train"}
    assert len(by_index[0]["processes"]) == 4  # main, child, escaped daemon, grandchild
    assert by_index[0]["leased_by"] == "train"
    assert by_index[0]["memory_used_bytes"] == (300 + 4 * 2048) << 20
    assert [p["owner"] for p in by_index[1]["processes"]] == ["foreign"]
    assert [p["owner"] for p in by_index[2]["processes"]] == ["orphan of old run 1"]
    assert [p["owner"] for p in by_index[3]["processes"]] == ["orphan"]
    human = h.tc("gpus", check=True).out
    assert "leased by train" in human
    assert "foreign" in human
    ps = h.tc("ps", "train", "--json", check=True).json()
    assert isinstance(ps, list)
    assert sum(1 for r in ps if r["gpu_holder"]) == 4
    assert all(r["gpu_bytes"] == 2048 << 20 for r in ps if r["gpu_holder"])
    h.tc("stop", "train", check=True)


def test_stop_proves_release(harness: Harness) -> None:
    h = harness
    path = fake_gpus(h)
    # a real driver frees a context's memory some time after its process died: the stop's
    # first look, started by its first signal, still sees it (the fake frees it at once
    # without this: under a loaded CI run the look came after the holders died, and the
    # stop said nothing was released)
    set_gpu_option(path, release_delay_s=0.5)
    start_gpu_job(h, "rel", "1,2")
    # the fake remembers a holder from a look that saw it alive, as NVML does a context
    wait_for(lambda: len(gpus_json(h)[1]["processes"]) == 4, what="run 1 holding its GPUs")
    restarted = h.tc("restart", "rel")
    assert restarted.rc == 0, restarted.out + restarted.err
    assert "GPU 1  released 8.0 GiB" in restarted.out
    assert h.state("rel")["run"] == 2
    assert [g["index"] for g in h.state("rel")["gpus"]] == [1, 2]  # the same GPUs again
    wait_for(lambda: len(gpus_json(h)[1]["processes"]) == 4, what="run 2 holding its GPUs")
    res = h.tc("stop", "rel", "--json")
    assert res.rc == 0, res.out
    gpus = res.json()["report"]["gpus"]  # type: ignore[index]
    assert [g["index"] for g in gpus] == [1, 2]
    for g in gpus:
        assert g["ok"] is True
        assert g["released_bytes"] == 4 * 2048 << 20
        assert g["used_bytes"] == g["baseline_bytes"]


def test_delayed_release_is_waited_for(harness: Harness) -> None:
    h = harness
    path = fake_gpus(h)
    set_gpu_option(path, release_delay_s=2)
    start_gpu_job(h, "slow", "0,")
    # the fake learns a holder from a look that sees it alive (the stop asks the driver
    # nothing before its signals): look, as a user would
    assert gpus_json(h)[0]["leased_by"] == "slow"
    res = h.tc("stop", "slow", "--json")
    assert res.rc == 0, res.out
    [g] = res.json()["report"]["gpus"]  # type: ignore[index]
    assert g["ok"] is True
    assert g["seconds"] >= 1.5


def test_memory_never_released_fails_truthfully(harness: Harness) -> None:
    h = harness
    path = fake_gpus(h)
    set_gpu_option(path, stuck=True)
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[gpu]\nrelease_timeout_s = 1.0\n")
    start_gpu_job(h, "leak", "0,")
    assert len(gpus_json(h)[0]["processes"]) == 4  # seen alive (the fake remembers them)
    res = h.tc("stop", "leak", "--gpu-timeout", "1", "--json")
    assert res.rc == 1
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["report"]["survivors"] == []
    [g] = doc["report"]["gpus"]
    assert g["ok"] is False
    assert g["excess_bytes"] == 4 * 2048 << 20
    assert "NVML lists no process" in g["note"]
    again = h.tc("stop", "leak")
    assert again.rc == 1
    assert "GPU 0  NOT RELEASED" in again.out
    human = h.tc("restart", "leak")
    assert human.rc == 1
    assert "not restarting leak: GPU 0 still holds 8.0 GiB\n" in human.err


def test_container_style_empty_process_list(harness: Harness) -> None:
    """NVML lists nothing (other PID namespace): holders are still found by their fds."""
    h = harness
    path = fake_gpus(h)
    set_gpu_option(path, hide_processes=True, process_memory=False)
    start_gpu_job(h, "ct", "0,")
    g0 = gpus_json(h)[0]
    assert {p["seen"] for p in g0["processes"]} == {"fd"}
    assert {p["owner"] for p in g0["processes"]} == {"ct"}
    assert all(p["used_bytes"] is None for p in g0["processes"])
    res = h.tc("stop", "ct", "--json")
    assert res.rc == 0
    assert res.json()["report"]["gpus"][0]["ok"] is True  # type: ignore[index]


def test_phantom_nvml_pids_are_never_attributed(harness: Harness) -> None:
    h = harness
    path = fake_gpus(h)
    set_gpu_option(path, processes=[{"pid": 4194000, "used": 1 << 30, "host": True}])
    g0 = gpus_json(h)[0]
    [p] = g0["processes"]
    assert p["pid"] == 4194000
    assert p["owner"] == "not visible here"


@pytest.mark.parametrize(
    ("init_error", "rc", "needle"),
    [
        ("DRIVER_NOT_LOADED", 0, "no NVIDIA driver found"),
        ("UNKNOWN", 1, "NVML: Unknown Error"),
    ],
)
def test_driver_failures(harness: Harness, init_error: str, rc: int, needle: str) -> None:
    h = harness
    path = fake_gpus(h)
    doc = json.loads(path.read_text())
    doc["init_error"] = init_error
    path.write_text(json.dumps(doc))
    res = h.tc("gpus")
    assert res.rc == rc
    assert needle in (res.out + res.err)
    start = h.tc("start", "--name", "g", "--gpus", "1", "--", "sleep", "1")
    assert start.rc == 1
    assert needle in start.err
    assert len(start.err.strip().splitlines()) == 1


def test_real_nvml_without_driver(harness: Harness) -> None:
    """No fake selected and no NVIDIA driver here: one clear line, never a traceback."""
    h = harness
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a real NVIDIA driver is present")
    res = h.tc("gpus")
    assert res.rc == 0
    assert res.out.strip().startswith("no NVIDIA driver found")
    start = h.tc("start", "--name", "g", "--gpus", "1", "--", "sleep", "1")
    assert start.rc == 1
    assert "no NVIDIA driver found" in start.err
    h.tc("start", "--name", "plain", "--", "true", check=True)  # no --gpus: no GPU needed


@pytest.mark.parametrize("min_gpus", [None, 2])
def test_a_leftover_holder_is_named_waited_for_then_left_out_or_refused(
    harness: Harness, min_gpus: int | None
) -> None:
    """Issue 47 §4: memory still held on GPU 1 after a crash (a process outside the job
    took it meanwhile) is waited for up to the GPU timeout and named; the relaunch then
    leaves GPU 1 out when min_gpus allows, else it is refused in one line. Never started
    onto."""
    h = harness
    fake_gpus(h, 3)
    extra = ["--min-gpus", str(min_gpus)] if min_gpus else []
    h.tc(
        "start", "--name", "c", "--gpus", "0,1,2", *extra, "--set", "restart=on-failure",
        "--set", "max_restarts=1", "--set", "restart_backoff=0.1s", "--set", "gpu_timeout=2s",
        "--", "sh", "-c", "sleep 1.5; exit 3",
        check=True,
    )  # fmt: skip
    squatter = holder(h, 1, mib=2048)  # after the start: not in the run's baseline
    if min_gpus is None:
        wait_for(lambda: h.state("c")["phase"] == "failed", 30, "the run to end")
        st = h.state("c")
        assert st["run"] == 1
        assert st["error"].startswith("not relaunching onto a held GPU: GPU 1 still holds 2.0 GiB")
        assert f"pid {squatter.pid}" in st["error"]
        assert f"pid {squatter.pid}" in h.tc("status", "c").out
    else:
        wait_for(lambda: h.state("c")["run"] == 2, 30, "run 2")
        assert [g["index"] for g in h.state("c")["gpus"]] == [0, 2]
        events = (h.home / "jobs" / "c" / "events.jsonl").read_text()
        assert f"GPU 1 still holds 2.0 GiB: pid {squatter.pid}" in events
        assert "running on 2 of 3 GPUs (GPU 1 left out, healthy now" in h.tc("status", "c").out
        wait_for(lambda: h.state("c")["phase"] == "failed", 30, "run 2 to end")
    squatter.kill()


@pytest.mark.parametrize("min_gpus", [None, 2])
def test_a_restart_by_hand_leaves_a_held_gpu_out_or_refuses_naming_it(
    harness: Harness, min_gpus: int | None
) -> None:
    """Issue 47 §4 through `trainctl restart` (deploy takes the same path): a GPU still
    held after the stop's release wait is named; with min_gpus the new run leaves it out,
    else the restart is refused in one line, and nothing is started onto it."""
    h = harness
    fake_gpus(h, 3)
    extra = ["--min-gpus", str(min_gpus)] if min_gpus else []
    h.tc(
        "start", "--name", "r", "--gpus", "0,1,2", *extra, "--set", "gpu_timeout=1s",
        "--", "sleep", "600",
        check=True,
    )  # fmt: skip
    squatter = holder(h, 1, mib=2048)  # after the start: not in the run's baseline
    res = h.tc("restart", "r", "--health", "0")
    held = f"GPU 1 still holds 2.0 GiB: pid {squatter.pid}"
    if min_gpus is None:
        assert res.rc == 1, res
        assert held in res.err, res
        last = res.err.strip().splitlines()[-1]
        assert last.startswith("trainctl: error: not restarting r: GPU 1 still holds"), last
        assert h.state("r")["run"] == 1
        assert h.state("r")["phase"] != "running"
    else:
        assert res.rc == 0, res
        assert f"leaving GPU(s) 1 out of the new run (min_gpus 2): {held}" in res.err, res
        assert h.state("r")["run"] == 2
        assert [g["index"] for g in h.state("r")["gpus"]] == [0, 2]
        env = (Path("/proc") / str(h.state("r")["main"]["pid"]) / "environ").read_bytes()
        assert b"CUDA_VISIBLE_DEVICES=0,2" in env.split(b"\0")
        assert h.tc("stop", "r").rc == 0
    squatter.kill()


def test_gpus_names_a_jobs_supervisor_and_leaves_itself_out(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real driver a run's supervisor holds the device nodes open for its GPU watch,
    and `trainctl gpus` holds them while it asks (seen on an H200: both were listed as
    "foreign"). The supervisor is named as its job's, by pid and start time from the
    state; the command leaves itself out of its own view."""
    h = harness
    fake_gpus(h, n=1)
    h.tc("start", "--name", "j", "--", "sleep", "600", check=True)
    sup = h.state("j")["supervisor"]
    markers, _ = gpus_mod.known_markers(h.home)
    assert gpus_mod.owner_of(GpuHolder(sup["pid"], cmd="python3"), markers) == "supervisor of j"
    stale = {m: replace(ref, supervisor=(sup["pid"], sup["start_ticks"] + 1))
             for m, ref in markers.items()}  # fmt: skip
    assert gpus_mod.owner_of(GpuHolder(sup["pid"], cmd="python3"), stale) == "foreign"
    for key in ("TRAINCTL_FAKE_GPU", "FAKE_DEV_DIR", "FAKE_GPU_MIB"):
        monkeypatch.setenv(key, h.env[key])
    fd = os.open(Path(h.env["FAKE_DEV_DIR"]) / "nvidia0", os.O_RDWR)  # this process: a holder
    try:
        views = gpus_mod.gpu_inventory(h.home).views
    finally:
        os.close(fd)
    assert os.getpid() not in {p.pid for v in views for p in v.processes}
    h.tc("stop", "j", check=True)
