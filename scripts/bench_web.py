"""Benchmarks of `trainctl web` and the samples behind it (issue 37), as ratios to targets.

1. The job page of a 7-day run (a week of synthetic samples at 10 s, 8 GPUs): <= 300 ms.
2. The jobs page (and its JSON) with 50 jobs, 5 of them running: <= 150 ms.
3. The supervisor's sampling cost: <= 0.1 % of a core, beside its idle figure. Measured
   two ways: the supervisor's CPU with sampling every 10 s against a twin sampling once a
   day, side by side over the same window (clock ticks: coarse); and one sample's own
   cost, timed in-process, over its interval.

4. The job page's goodput line (`report`'s first) on a week of per-step progress lines
   (a million): a whole read (what `report` does, and the page did on every load) against
   the web server's points cache, first and after an append; the page waits 0.25 s at
   most for it, and what a page left open costs the box.

No asserts: it prints figures and ratios. Run: bash scripts/bench.sh --web
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainctl.launcher.ops import goodput
from trainctl.launcher.web import goodput as goodput_lines
from trainctl.supervisor.model.state import log_path, progress_path
from trainctl.supervisor.watch import samples

TRAINCTL = [sys.executable, "-m", "trainctl.launcher"]


def tc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*TRAINCTL, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 3):
        raise SystemExit(f"trainctl {' '.join(args)}: {done.stderr}")
    return done


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def supervisor_pid(home: Path, job: str) -> int:
    return int(json.loads((home / "jobs" / job / "state.json").read_text())["supervisor"]["pid"])


def bench_sampling(home: Path, env: dict[str, str], duration_s: float) -> None:
    """3. Two twins, one sampling every 10 s, one once a day, measured over one window."""
    cfgs = {}
    for name, every in (("sampled", "10s"), ("unsampled", "1d")):
        cfgs[name] = home.parent / f"{name}.toml"
        cfgs[name].write_text(f'[supervisor]\nsample_interval = "{every}"\n')
        tc(
            {**env, "TRAINCTL_CONFIG": str(cfgs[name])},
            "start",
            "--name",
            name,
            "--",
            "sleep",
            "3600",
        )
    time.sleep(12)  # past the first snapshots and the first sample
    pids = {n: supervisor_pid(home, n) for n in cfgs}
    t0, c0 = time.monotonic(), {n: cpu_ticks(p) for n, p in pids.items()}
    time.sleep(duration_s)
    t1, c1 = time.monotonic(), {n: cpu_ticks(p) for n, p in pids.items()}
    hz = os.sysconf("SC_CLK_TCK")
    pct = {n: (c1[n] - c0[n]) / hz / (t1 - t0) * 100 for n in pids}
    # one sample's own cost, in this process, on the sampled twin's run
    jdir = home / "jobs" / "sampled"
    st = json.loads((jdir / "state.json").read_text())
    main = st["main"]
    src = samples.Sources(
        members=((main["pid"], main["start_ticks"]),),
        memory_group=None,
        gpu_mem={str(g): 40 << 30 for g in range(8)},
        gpu_util={str(g): 97 for g in range(8)},
        progress_file=progress_path(jdir, 1),
        log=log_path(jdir, 1),
        progress_regex=None,
    )
    book = samples.SampleLog(home.parent / "scratch" / "run-1.log")
    book.log.parent.mkdir(exist_ok=True)
    meter = samples.CpuMeter()
    n = 500
    c_start = time.process_time()
    for _ in range(n):
        book.append(samples.look(src, meter, time.time()))
    each_s = (time.process_time() - c_start) / n
    for name in cfgs:
        tc(env, "stop", name)
    print(
        f"3. sampling cost: one sample (8 GPUs) takes {each_s * 1e6:.0f} µs of CPU -> "
        f"{each_s / 10 * 100:.4f} % of a core at 10 s (target <= 0.1 %: "
        f"{each_s / 10 * 100 / 0.1:.3f}x); supervisor over {duration_s:.0f} s: sampling every "
        f"10 s {pct['sampled']:.3f} %, once a day (today's idle figure) "
        f"{pct['unsampled']:.3f} % of a core (10 ms clock ticks)"
    )


def fetch_ms(base: tuple[str, int], token: str, path: str, n: int) -> float:
    times = []
    for _ in range(n):
        conn = http.client.HTTPConnection(*base, timeout=60)
        t0 = time.perf_counter()
        conn.request(
            "GET",
            path,
            headers={"Host": f"127.0.0.1:{base[1]}", "Cookie": f"trainctl_token={token}"},
        )
        r = conn.getresponse()
        r.read()
        times.append((time.perf_counter() - t0) * 1000)
        conn.close()
        if r.status != 200:
            raise SystemExit(f"GET {path}: {r.status}")
    return statistics.median(times)


def fetch_body(base: tuple[str, int], token: str, path: str) -> bytes:
    conn = http.client.HTTPConnection(*base, timeout=60)
    conn.request(
        "GET", path, headers={"Host": f"127.0.0.1:{base[1]}", "Cookie": f"trainctl_token={token}"}
    )
    try:
        return conn.getresponse().read()
    finally:
        conn.close()


def week_of_samples(home: Path, job: str) -> int:
    log = home / "jobs" / job / "logs" / "run-1.log"
    book = samples.SampleLog(log)
    t = time.time() - 7 * 86400
    for i in range(7 * 24 * 360):
        book.append(
            samples.Sample(
                t=t + 10 * i,
                cpu_pct=180.0 + i % 7,
                mem_bytes=(30 << 30) + (i % 100 << 20),
                members=41,
                gpu_mem={str(g): (60 << 30) + (i % 50 << 20) for g in range(8)},
                gpu_util={str(g): 90 + i % 10 for g in range(8)},
                progress={"step": float(i), "loss": 3.0 / (1 + i / 1000)},
            )
        )
    return sum(p.stat().st_size for p in log.parent.glob("run-1.samples*"))


def week_of_progress(home: Path, job: str, n: int = 1_000_000) -> int:
    """A step every 0.6 s for a week, each a $TRAINCTL_PROGRESS line with its time."""
    path = progress_path(home / "jobs" / job, 1)
    t = time.time() - n * 0.6
    with open(path, "w") as f:
        for i in range(1, n + 1):
            loss = 3.0 / (1 + i / 1000)
            f.write(f'{{"step": {i}, "loss": {loss:.5f}, "t": {t + 0.6 * i:.3f}}}\n')
    return path.stat().st_size


def bench_goodput_line(home: Path, job: str) -> None:
    """4. report whole against the points cache, in this process (the server's code)."""
    took = {}
    t0 = time.perf_counter()
    whole = goodput.report(home, job)
    took["whole"] = time.perf_counter() - t0
    cache = goodput.PointsCache()
    t0 = time.perf_counter()
    first = goodput.report(home, job, cache)
    took["first"] = time.perf_counter() - t0
    path = progress_path(home / "jobs" / job, 1)
    with open(path, "a") as f:  # ~10 minutes more of the run
        for i in range(1_000_001, 1_001_001):
            f.write(f'{{"step": {i}, "loss": 0.1, "t": {time.time():.3f}}}\n')
    t0 = time.perf_counter()
    goodput.report(home, job, cache)
    took["again"] = time.perf_counter() - t0
    every = max(goodput_lines.REFRESH_S, goodput_lines.COST_FACTOR * took["again"])
    same = whole.goodput == first.goodput and whole.lost_s == first.lost_s
    print(
        f"4. goodput line of a week of per-step lines (1M): a whole read {took['whole']:.2f} s "
        f"(the page's cost on every load before); the server's cache: first {took['first']:.2f} s, "
        f"after 1,000 more lines {took['again']:.2f} s, made again every {every:.0f} s while "
        f"a page is open -> {100 * took['again'] / every:.1f} % of a core; the same figures "
        f"as the whole read: {same}"
    )


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-web-"))
    home = tmp / "home"
    env = {**os.environ, "TRAINCTL_HOME": str(home), "TRAINCTL_CONFIG": str(tmp / "c.toml")}
    (tmp / "c.toml").write_text("")
    for i in range(50):
        argv = ["sleep", "3600"] if i < 5 else ["true"]
        tc(env, "start", "--name", f"job{i:02d}", "--", *argv)
    size = week_of_samples(home, "job00")
    lines = week_of_progress(home, "job00")
    web = subprocess.Popen(
        [*TRAINCTL, "web", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert web.stdout is not None
        url = web.stdout.readline().strip()
        hostport, token = url.split("//", 1)[1].split("/?token=")
        base = (hostport.split(":")[0], int(hostport.split(":")[1]))
        fetch_ms(base, token, "/", 3)  # warm
        first = fetch_ms(base, token, "/jobs/job00", 1)  # starts its goodput line
        t0 = time.perf_counter()
        while b"class='goodput'" not in fetch_body(base, token, "/jobs/job00/charts"):
            time.sleep(0.2)
        made = time.perf_counter() - t0
        page = fetch_ms(base, token, "/jobs/job00", 10)
        refresh = fetch_ms(base, token, "/jobs/job00/charts", 10)
        print(
            f"1. job page of a 7-day run ({size / 2**20:.1f} MB of samples, "
            f"{lines / 2**20:.0f} MB of per-step progress lines, 8 GPUs): "
            f"{page:.0f} ms (median of 10, its goodput line made) -> {page / 300:.2f}x the "
            f"300 ms target; the first load {first:.0f} ms (it waits 0.25 s for the line at "
            f"most), the line on the page {made:.1f} s later; the charts' refresh (every 10 s) "
            f"{refresh:.0f} ms"
        )
        jobs = fetch_ms(base, token, "/", 20)
        api = fetch_ms(base, token, "/api/jobs", 20)
        print(
            f"2. jobs page with 50 jobs: {jobs:.0f} ms, its JSON {api:.0f} ms (median of 20) "
            f"-> {jobs / 150:.2f}x / {api / 150:.2f}x the 150 ms target"
        )
    finally:
        web.terminate()
        web.wait()
        for i in range(5):
            tc(env, "stop", f"job{i:02d}")
    bench_goodput_line(home, "job00")
    bench_sampling(home, env, float(os.environ.get("BENCH_SAMPLING_S", "60")))


if __name__ == "__main__":
    main()
