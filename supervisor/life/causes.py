"""Why a run ended: the kind of end (from the supervisor) and the reason (from the job).

The kind (:class:`Cause` ``kind``) is what the supervisor saw:

==================== ========================================================================
``clean``            main exited 0 on its own
``stopped``          trainctl stopped it: ``by`` names the verb (stop, restart, rm) or the
                     stall watchdog; ``signal`` is what main died of, SIGKILL after the grace
``exit``             main exited non-zero on its own (``exit_code``)
``signal``           main was killed by a signal trainctl did not send (``signal``)
``oom``              the kernel's OOM killer took a process of the job (``oom_pid``,
                     ``oom_cmd``, the group's ``oom_kills`` and the cap, if one was set)
``restarts-exhausted`` / ``crash-loop`` / ``no-progress``
                     the restart policy gave up; ``last`` is the final run's own cause
``lost``             the supervisor is gone (derived by `status`, never stored)
==================== ========================================================================

The reason is read from the job itself, cheaply and only when a run ended on its own:
torchrun's error file first (``TORCHELASTIC_ERROR_FILE``, which trainctl sets: failing
rank, exit code, exception, time), else the last Python traceback's final line in the log
tail. Both are classified by a pattern table (:data:`CLASSES`), which config extends with
``[causes] name = "regex"``.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.supervisor.linux import memory
from trainctl.supervisor.model.reports import Cause, signal_name
from trainctl.supervisor.model.spec import RESTART_WORDS, Spec
from trainctl.supervisor.model.tail import tail_text
from trainctl.supervisor.records import record, replace

if TYPE_CHECKING:  # a type only: the analysis reads what the owner hands it
    from trainctl.supervisor.model.state import JobState

# Built-in pattern classes, tried in order after the config's own.
CLASSES: tuple[tuple[str, str], ...] = (
    (
        "cuda-oom",
        r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory"
        r"|CUBLAS_STATUS_ALLOC_FAILED",
    ),
    (
        "nccl-timeout",
        r"NCCL[^\n]{0,300}?(?:[Tt]imeout|timed out)|[Ww]atchdog caught collective operation "
        r"timeout",
    ),
    ("gloo-timeout", r"[Gg]loo[^\n]{0,300}?(?:[Tt]imeout|[Tt]imed out)"),
    (
        "xid",
        r"\bXid\b|uncorrectable ECC error|an illegal memory access was encountered"
        r"|unspecified launch failure|GPU is lost|fallen off the bus",
    ),
    ("segfault", r"Segmentation fault|SIGSEGV|Fatal Python error: Segmentation"),
)
TAIL_BYTES = 64 << 10  # how much of the log end is read for a reason
REASON_CHARS = 300


# ---------------------------------------------------------------- the job's own reason


@record(frozen=True)
class Reason:
    """What the job said about its failure."""

    text: str | None = None
    klass: str | None = None
    rank: int | None = None
    source: str | None = None
    at: float | None = None
    exit_code: int | None = None


def compile_classes(extra: dict[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    """The config's classes first (they win), then the built-in ones."""
    out = [(name, re.compile(rx)) for name, rx in extra.items()]
    return out + [(name, re.compile(rx)) for name, rx in CLASSES if name not in extra]


def classify(text: str, classes: list[tuple[str, re.Pattern[str]]]) -> str | None:
    """The first class whose pattern occurs in ``text``."""
    for name, rx in classes:
        if rx.search(text):
            return name
    return None


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
_ROOT_RANK = re.compile(r"Root Cause[^\n]*\n(?:.*\n){0,4}?\s*rank\s*:\s*(\d+)")
_ROOT_CODE = re.compile(r"Root Cause[^\n]*\n(?:.*\n){0,6}?\s*exitcode\s*:\s*(-?\d+)")
_LAUNCHER_ERRORS = ("ChildFailedError", "SignalException")  # torchrun's own, not the job's
# A SyntaxError (or IndentationError) in the entry script is printed without a
# "Traceback" header: `  File "train.py", line 3`, the code, a caret, then this line.
_BARE_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?::|$)")


# What a rank dies of when another rank died first: a peer's closed connection, a
# watchdog's timeout, an aborted process group. Never the root cause while an original
# error is in the log.
_CONSEQUENTIAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ProcessGroup\w* "
    r"(?:is )?abort|NCCL communicator was aborted|[Ww]atchdog caught collective|"
    r"DistBackendError|DistNetworkError|Connection refused|timed out|Timed out|TimeoutError"
)


def tracebacks(tail: str) -> list[tuple[str, int | None]]:
    """The final line of every Python traceback in ``tail`` that is the job's own, in
    order, each with the rank its lines were prefixed with (torchrun's ``[rankN]:``)."""
    lines = tail.splitlines()
    found: list[tuple[str, int | None]] = []
    for i, raw in enumerate(lines):
        m = _RANK_PREFIX.match(raw)
        line = raw[m.end() :] if m else raw
        if not line.startswith("Traceback (most recent call last):"):
            continue
        final = _final_line(lines, i + 1)
        if final is not None:
            final = unshuffled(final)
        if final is not None and not any(e in final for e in _LAUNCHER_ERRORS):
            found.append((final[:REASON_CHARS], int(m.group(1)) if m else None))
    return found


def unshuffled(line: str) -> str:
    """One rank's words from a line two ranks wrote at once: unbuffered stderr writes an
    exception's parts one by one, so two ranks failing together interleave them
    (``ImportErrorImportError: : broken deploybroken deploy``). A line made wholly of
    parts each written twice in a row is taken once; any other line is left as it is."""
    n = len(line)
    if n < 4 or n % 2 or n > 2 * REASON_CHARS:
        return line
    # cut[i]: where the last doubled part of line[:i] begins (-1: line[:i] is not made so)
    cut = [-1] * (n + 1)
    cut[0] = 0
    for i in range(2, n + 1, 2):
        for j in range(i - 2, -1, -2):
            m = (i + j) // 2
            if cut[j] >= 0 and line[j:m] == line[m:i]:
                cut[i] = j
                break
    if cut[n] < 0:
        return line
    parts, i = [], n
    while i > 0:
        j = cut[i]
        parts.append(line[j : (i + j) // 2])
        i = j
    once = "".join(reversed(parts))
    return once if _BARE_ERROR.match(once) else line


def root_traceback(
    found: list[tuple[str, int | None]], root_rank: int | None
) -> tuple[str, int | None] | None:
    """The traceback that caused the end: the root-cause rank's own (torchrun names it),
    an original error over a consequential one (a peer closed, a watchdog), else the last.
    """
    if root_rank is not None:
        mine = [t for t in found if t[1] == root_rank]
        original = [t for t in mine if not _CONSEQUENTIAL.search(t[0])]
        if original or mine:
            return (original or mine)[-1]
    original = [t for t in found if not _CONSEQUENTIAL.search(t[0])]
    return (original or found)[-1] if found else None


def _bare_error(tail: str) -> str | None:
    """An exception line among the log's last lines that has no traceback header."""
    for raw in reversed(tail.splitlines()[-5:]):
        line = _RANK_PREFIX.sub("", raw, count=1).strip()
        if _BARE_ERROR.match(line):
            return line[:REASON_CHARS]
    return None


def _final_line(lines: list[str], start: int) -> str | None:
    for raw in lines[start : start + 400]:
        line = _RANK_PREFIX.sub("", raw, count=1)
        if not line.strip():
            continue
        if line[0] in " \t":
            continue  # a frame, or its code line
        return line.strip()
    return None


def read_error_file(path: Path, not_before: float) -> Reason | None:
    """torchrun's record of the first failing worker (only one written during this run)."""
    try:
        if path.stat().st_mtime < not_before - 1:
            return None  # the job's own TORCHELASTIC_ERROR_FILE, left from another run
        doc = json.loads(path.read_bytes()[: 1 << 20])
    except (OSError, ValueError):
        return None
    msg = doc.get("message") if isinstance(doc, dict) else None
    extra: Any = {}
    code = None
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        code = msg.get("errorCode") if isinstance(msg.get("errorCode"), int) else None
        msg = msg.get("message")
    if not isinstance(msg, str) or not msg.strip():
        return None
    at = None
    try:
        at = float(extra.get("timestamp"))
    except (TypeError, ValueError):
        at = None
    rank = _ROOT_RANK.search(msg)
    root_code = _ROOT_CODE.search(msg)
    if code is None and root_code is not None:
        code = int(root_code.group(1))
    text = None if "ChildFailedError" in msg else msg.strip().splitlines()[0][:REASON_CHARS]
    return Reason(
        text=text,
        rank=int(rank.group(1)) if rank else None,
        source="torchelastic",
        at=at,
        exit_code=code,
    )


def job_reason(
    log: Path, error_file: Path | None, started_at: float, extra: dict[str, str]
) -> Reason:
    """The job's own reason for a failed end: error file, else log tail; classified."""
    classes = compile_classes(extra)
    tail = tail_text(log, TAIL_BYTES)
    ef = read_error_file(error_file, started_at) if error_file is not None else None
    root = _ROOT_RANK.search(tail)
    root_rank = ef.rank if ef is not None and ef.rank is not None else None
    if root_rank is None and root is not None:
        root_rank = int(root.group(1))
    tb = root_traceback(tracebacks(tail), root_rank)
    text, rank, source = None, None, None
    if ef is not None:
        text, rank, source = ef.text, ef.rank, "torchelastic"
    own_exit = _root_exit(tail, root_rank, tb)
    if text is None and own_exit is not None:
        text, rank, source = own_exit, root_rank, "log"
    if text is None and tb is not None:
        text = tb[0]
        source = source or "log"
    if text is None:
        bare = _bare_error(tail)
        if bare is not None:
            text, source = bare, "log"
    if rank is None:
        rank = root_rank if root_rank is not None else (tb[1] if tb is not None else None)
    klass = classify(text, classes) if text else None
    if klass is None:
        klass, line, line_rank = _class_in_tail(tail, classes)
        if text is None and line is not None:
            text, source = line, "log"
        if rank is None:
            rank = line_rank  # c10d prefixes its watchdog lines with [rankN]:
    if rank is None and text and (inside := _RANK_IN_TEXT.search(text)):
        rank = int(inside.group(1))  # "[Rank 1] Watchdog caught collective operation timeout"
    return Reason(
        text=text,
        klass=klass,
        rank=rank,
        source=source,
        at=ef.at if ef else None,
        exit_code=ef.exit_code if ef else None,
    )


def _root_exit(tail: str, root_rank: int | None, tb: tuple[str, int | None] | None) -> str | None:
    """The root-cause rank's own exit, when it left no traceback of its own: torchrun's
    Root Cause block names it (``rank: 1 ... exitcode: -9``), and a peer's traceback is
    only the consequence (``Connection closed by peer``): `rank 1 killed by SIGKILL`."""
    found = _ROOT_CODE.search(tail)
    if root_rank is None or found is None:
        return None
    code = int(found.group(1))
    if code < 0:  # killed by a signal, it wrote no traceback as it died: one under its
        # prefix came from its DataLoader workers, cut off from it (a ConnectionResetError,
        # or an EOFError from their index queue: which one, and whether it is written
        # before torchrun's summary, depends on timing; a busy CI run wrote the EOFError)
        return f"rank {root_rank} killed by {signal_name(-code)} (exit code {code})"
    consequence = tb is not None and bool(_CONSEQUENTIAL.search(tb[0]))
    own = tb is not None and tb[1] == root_rank
    maybe_own = tb is not None and tb[1] is None and not consequence
    if own or maybe_own:
        return None  # its own traceback (or one that may be its own and is no consequence)
    return f"rank {root_rank} exited with code {code}, with no traceback of its own"


_RANK_IN_TEXT = re.compile(r"\[Rank (\d+)\]")


def _class_in_tail(
    tail: str, classes: list[tuple[str, re.Pattern[str]]]
) -> tuple[str | None, str | None, int | None]:
    """A class found in the last lines (NCCL watchdogs, a shell's "Segmentation fault"),
    its line, and the rank that line was prefixed with."""
    for raw in reversed(tail.splitlines()[-200:]):
        klass = classify(raw, classes)
        if klass is not None:
            m = _RANK_PREFIX.match(raw)
            line = (raw[m.end() :] if m else raw).strip()[:REASON_CHARS]
            # an NCCL watchdog names its rank inside its text: "[Rank 1] Watchdog caught..."
            inside = _RANK_IN_TEXT.search(line)
            rank = int(m.group(1)) if m else (int(inside.group(1)) if inside else None)
            return klass, line, rank
    return None, None, None


# ---------------------------------------------------------------- the kind of end


def _with_reason(summary: str, r: Reason) -> str:
    if r.text:
        summary += f": {r.text}"
    if r.rank is not None and not (r.text or "").startswith(f"rank {r.rank} "):
        summary += f" (rank {r.rank})"  # unless its text begins with it: "rank 1 killed by"
    if r.klass and (not r.text or r.klass not in r.text.lower()):
        summary += f" [{r.klass}]"
    return summary


def ended_on_its_own(
    code: int | None,
    died_of: int | None,
    reason: Reason,
    oom: tuple[int, str | None, int, int | None] | None = None,
) -> Cause:
    """The cause of a run whose main ended without trainctl asking it to.

    ``died_of``: the signal that killed main, if one did; ``oom``: (pid, cmd, kills, cap)
    when the kernel's OOM killer took a process of the job.
    """
    base: dict[str, Any] = {
        "exit_code": code,
        "reason": reason.text,
        "reason_class": reason.klass,
        "rank": reason.rank,
        "source": reason.source,
        "at": reason.at,
    }
    if oom is not None:
        pid, cmd, kills, cap = oom
        who = f"pid {pid}" + (f" ({cmd})" if cmd else "") if pid else "a process of the job"
        cap_text = f", cap {cap >> 20} MiB" if cap else ""
        summary = f"OOM-killed: {who}{cap_text}, {kills} OOM kill(s) in the job's group"
        return Cause(
            kind="oom",
            summary=summary,
            oom_pid=pid or None,
            oom_cmd=cmd,
            oom_kills=kills,
            cap_bytes=cap,
            **base,
        )
    if died_of is not None:
        name = signal_name(died_of)
        klass = reason.klass or ("segfault" if died_of in (signal.SIGSEGV, signal.SIGBUS) else None)
        r = Reason(reason.text, klass, reason.rank, reason.source, reason.at)
        return Cause(
            kind="signal",
            summary=_with_reason(f"killed by {name}, not sent by trainctl", r),
            signal=name,
            signal_from="outside",
            **{**base, "reason_class": klass},
        )
    if code == 0:
        return Cause(kind="clean", summary="clean exit (code 0)", exit_code=0)
    if code is None:
        text = "ended on its own; exit code unknown (adopted: trainctl is not its parent)"
        return Cause(kind="unknown", summary=_with_reason(text, reason), **base)
    return Cause(kind="exit", summary=_with_reason(f"exit code {code}", reason), **base)


def stopped(by: str, code: int | None, grace_s: float | None = None) -> Cause:
    """A run that trainctl ended: by a verb, or by the stall watchdog."""
    died = code - 128 if code is not None and 128 < code < 192 else None
    name = signal_name(died) if died is not None else None
    if by == "stall watchdog":
        summary = "stopped by the stall watchdog"
    elif by == "shutdown":
        summary = (
            "stopped gracefully as systemd stopped its scope (host shutdown or systemctl stop)"
        )
    elif by.startswith("SIG"):
        summary = f"stopped on {by} to its supervisor (the job's own graceful stop)"
    else:
        summary = f"stopped by trainctl {by}"
    if died == signal.SIGKILL:
        grace = "the grace" if grace_s is None else f"the {grace_s:g} s grace"
        summary += f", main SIGKILLed after {grace}"
    return Cause(
        kind="stopped",
        summary=summary,
        exit_code=code,
        signal=name,
        signal_from="trainctl" if name else None,
        by=by,
    )


@record(frozen=True)
class LostGpu:
    """The facts of a GPU a run lost (the lifecycle's GpuLost event, as causes reads it)."""

    gpu: int | None
    xid: int | None
    action: str
    healthy: tuple[str, ...]  # the labels of the run's GPUs left healthy
    leased: int


def gpu_lost(lost: LostGpu, *, job: str, min_gpus: int | None, code: int | None) -> Cause:
    """A run stopped for a lost GPU: what was lost, and how the run goes on (on its own
    with ``min_gpus``, or the command that starts it on the GPUs left)."""
    xid = f"Xid {lost.xid}: " if lost.xid is not None else ""
    what = f"GPU {lost.gpu} lost ({xid}{lost.action})"
    n, labels = len(lost.healthy), ",".join(lost.healthy)
    if min_gpus is not None and n >= min_gpus:
        advice = f"restarting on {n} of {lost.leased} GPU(s): {labels} (min_gpus {min_gpus})"
    elif n:
        advice = (
            f"to go on on {n} GPU(s): trainctl start {job} --gpus {labels}, (a process count "
            "of $TRAINCTL_GPU_COUNT follows it; --min-gpus N restarts on its own)"
        )
        if min_gpus is not None:
            advice = f"{n} healthy GPU(s) left, fewer than min_gpus {min_gpus}; {advice}"
    else:
        advice = "no other GPU of the run is left"
    return Cause(kind="gpu", summary=f"{what}; {advice}", gpu=what, exit_code=code)


def gave_up(kind: str, last: Cause, restarts: int, why: str) -> Cause:
    """restarts-exhausted / crash-loop: the restart policy's end, keeping the run's cause."""
    line = last.summary
    return Cause(
        kind=kind,
        summary=f"{why}; last run: {line}" if line else why,
        restarts=restarts,
        last=line or None,
        exit_code=last.exit_code,
        signal=last.signal,
        reason=last.reason,
        reason_class=last.reason_class,
        rank=last.rank,
    )


# ---------------------------------------------------------------- restart_on


def check_restart_on(words: Iterable[str], extra: dict[str, str]) -> list[str]:
    """Return the problems with ``restart_on`` (empty: every entry is known)."""
    known = [*RESTART_WORDS, *(n for n, _ in CLASSES), *extra]
    bad = []
    for w in words:
        if w in known:
            continue
        if w.startswith("exit:") and w[5:].isdigit() and 0 < int(w[5:]) < 256:
            continue
        bad.append(w)
    if bad:
        return [f"unknown cause {b!r} (use {', '.join(known)} or exit:N with N 1-255)" for b in bad]
    return []


def matches(cause: Cause, words: Iterable[str]) -> str | None:
    """The first ``restart_on`` entry that this failed run's cause meets, or None."""
    kind = cause.kind
    for w in words:
        if w == "failure" and kind not in ("clean", "stopped"):
            return w
        if w == "oom" and kind == "oom":
            return w
        if w == "signal" and kind == "signal":
            return w
        if w.startswith("exit:") and kind == "exit" and str(cause.exit_code) == w[5:]:
            return w
        if w == cause.reason_class:
            return w
    return None


# ---------------------------------------------------------------- a run's own end


def analyse_end(
    files: tuple[Path, Path],
    st: JobState,
    spec: Spec,
    status: int | None,
    code: int | None,
    oom_kills: int,
    victims: list[memory.Victim],
) -> Cause:
    """Why main ended on its own: its exit, a signal, the OOM killer; the job's reason.

    ``files``: the run's log and its torchelastic error file; ``status``: main's wait
    status (None: not our child); ``code``: its shell-style exit code; ``oom_kills``: the
    kernel's count in the run's memory group; ``victims``: the OOM kills the supervisor
    saw in the kernel log (watchers)."""
    died_of = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
    reason = Reason()
    if code != 0 or died_of is not None:
        reason = job_reason(files[0], files[1], st.started_at, spec.causes)
    oom = _oom_of(st, spec, died_of, oom_kills, victims)
    cause = ended_on_its_own(code, died_of, reason, oom)
    if (code != 0 or died_of is not None) and st.gpu_faults:
        # a GPU that failed during the run is why it died, before the job's own words
        fault = st.gpu_faults[-1]
        cause = replace(cause, gpu=fault, summary=f"{fault}, then {cause.summary}")
    return cause


def _oom_of(
    st: JobState, spec: Spec, died_of: int | None, kills: int, victims: list[memory.Victim]
) -> tuple[int, str | None, int, int | None] | None:
    """(pid, cmd, kills, cap) when the OOM killer took a process of the job."""
    if not kills and died_of != signal.SIGKILL:
        return None
    cmds = {m.pid: m.cmd for m in st.members}
    main = st.main.pid if st.main else 0
    if not kills and not victims:
        return None  # a SIGKILL from someone else, not the OOM killer
    pick = next((v for v in victims if v.pid == main), victims[0] if victims else None)
    if pick is None and died_of == signal.SIGKILL:
        pick = memory.Victim(main, "")
    cap = spec.memory.max_bytes
    if pick is None:
        return (0, None, kills, cap)
    cmd = cmds.get(pick.pid)
    if not cmd and pick.pid == main:
        cmd = " ".join(spec.argv)
    cmd = (cmd or pick.comm)[:200] or None
    return (pick.pid, cmd, kills or len(victims), cap)
