"""Look at new code before a deploy stops the run it replaces.

A deploy of code that cannot start (a syntax error, an import of a module that is not
installed) used to cost a whole round: the old run's stop, the new run's failed start,
and the rollback's restore (issue 56: ~8 s of a 2-rank CPU job; minutes where the restore
loads a large checkpoint onto 8 GPUs). The look finds both before anything is stopped,
in the job's own interpreter and environment: launcher/codecheck_probe.py compiles the
entry script and the modules beside it that it imports, and looks for the modules they
import, executing none of the job's code.

The interpreter is the job's command when it is Python (``python train.py``,
``python -m pkg.train``), else the one a launcher's ``#!`` line names (torchrun,
accelerate, deepspeed: console scripts of the job's venv), with the first ``.py`` file
among its arguments as the entry. A shell script or a binary is not looked into: the
plan says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainctl.launcher.results.ops import CodeCheck
from trainctl.supervisor.errors import SpawnError
from trainctl.supervisor.model.spec import Spec

PROBE = Path(__file__).with_name("codecheck_probe.py")
TIMEOUT_S = 60.0  # a cold venv on a network file system; past it, the run is left to tell
PYTHON = re.compile(r"(python|pypy)(\d+(\.\d+)*)?$")
HEAD_BYTES = 512  # of a launcher: its #! line
ARG_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")  # python's options that take a value
# Python programs that run the job in an environment of their choosing (`conda run -n
# env ...`, `poetry run ...`): their own #! Python is not the job's
ENV_SWITCHERS = frozenset(
    {"conda", "mamba", "micromamba", "poetry", "pipenv", "hatch", "pdm", "pixi", "rye",
     "tox", "nox", "pipx", "uv", "uvx", "virtualenv"}
)  # fmt: skip

Entry = tuple[str, str]  # ("file", PATH) | ("module", NAME)


def refuse_broken(name: str, spec: Spec, source: str, *, verb: str) -> CodeCheck:
    """The code in ``source`` that ``spec`` would run, looked at by the job's own
    interpreter before ``verb`` stops anything: code that cannot start (a syntax error,
    a module not there, a file a git snapshot leaves out) is refused here instead of
    costing a stop, a failed start and a way back."""
    seen = check(spec.argv, source, spec.env, git_snapshot=spec.snapshot.mode == "git")
    if seen.problems:
        more = f" (and {len(seen.problems) - 1} more)" if len(seen.problems) > 1 else ""
        raise SpawnError(
            f"job {name}: the new code would not start: {seen.problems[0]}{more}; nothing "
            f"was stopped (looked at by {seen.python}; --no-check {verb} anyway)"
        )
    return seen


def check(
    argv: Sequence[str], cwd: str, env: Mapping[str, str], *, git_snapshot: bool = False
) -> CodeCheck:
    """What the job's interpreter finds wrong with the code in ``cwd`` that ``argv``
    would run (nothing executed); ``unchecked`` says why it could not look.
    ``git_snapshot``: the run takes a git snapshot of ``cwd``, which holds no untracked
    file: one the code imports is a problem too."""
    cwd = os.path.abspath(cwd)
    found = _interpreter(argv, cwd, env)
    if isinstance(found, str):
        return CodeCheck(unchecked=found)
    python, entries = found
    if not entries:
        return CodeCheck(python=python, unchecked="no Python file named in the job's command")
    order = json.dumps({"cwd": cwd, "entries": entries})
    try:
        done = subprocess.run(
            [python, "-c", PROBE.read_text(), order],
            cwd=cwd,
            env={**env, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CodeCheck(python=python, unchecked=f"{python} took over {TIMEOUT_S:g} s")
    except OSError as e:
        return CodeCheck(python=python, unchecked=f"{python}: {e.strerror}")
    try:
        said = json.loads(done.stdout.decode(errors="replace").splitlines()[-1])
    except (IndexError, ValueError):
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
        return CodeCheck(python=python, unchecked=f"{python} could not look: {why[0][:200]}")
    followed = [(str(f), w) for f, w in said.get("followed") or []]
    left_out = _untracked(cwd, followed) if git_snapshot else []
    return CodeCheck(
        python=python,
        version=str(said.get("python") or ""),
        problems=[str(p) for p in said.get("problems") or []] + left_out,
        files=int(said.get("files") or 0),
        imports=int(said.get("imports") or 0),
        unchecked=said.get("unchecked"),
        entry=entries[0][1],
    )


def _untracked(cwd: str, followed: list[tuple[str, str | None]]) -> list[str]:
    """The files the code imports that git does not track (and does not ignore: ignored
    ones are linked into a snapshot): a git snapshot leaves them out."""
    if not followed:
        return []
    try:
        done = subprocess.run(
            ["git", "-C", cwd, "ls-files", "-z", "--others", "--exclude-standard", "--",
             *(f for f, _ in followed if not os.path.isabs(f))],
            capture_output=True, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:  # a path outside the repository: left to the run
        return []
    out = set(done.stdout.decode(errors="replace").split("\0"))
    return [
        f"{f}{f' (imported at {w})' if w else ''} is not in git: a git snapshot leaves it "
        "out (git add it)"
        for f, w in followed
        if f in out
    ]


def _interpreter(
    argv: Sequence[str], cwd: str, env: Mapping[str, str]
) -> tuple[str, list[Entry]] | str:
    """(the job's Python, its entries), or why there is none to ask."""
    if not argv:
        return "the job has no command"
    prog = _program(argv[0], cwd, env)
    if prog is None:
        return f"{argv[0]} is not found on the job's PATH"
    if PYTHON.match(os.path.basename(prog)):
        return prog, _python_entries(argv[1:], cwd)
    name = os.path.basename(argv[0])
    if name in ENV_SWITCHERS or any(PYTHON.match(os.path.basename(a)) for a in argv[1:]):
        return f"{name} runs the job in an environment of its own choosing"
    python = _shebang_python(prog, cwd, env)
    if python is None:
        return f"{name} is not a Python program"
    return python, _launcher_entries(argv[1:], cwd)


def _program(name: str, cwd: str, env: Mapping[str, str]) -> str | None:
    if "/" in name:
        path = os.path.join(cwd, name)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _shebang_python(prog: str, cwd: str, env: Mapping[str, str]) -> str | None:
    """The Python a launcher's ``#!`` line names (``#!/usr/bin/env python3`` included)."""
    try:
        with open(prog, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        words[:1] = [_program(words[0], cwd, env) or ""] if words else []
    if not words or not PYTHON.match(os.path.basename(words[0])):
        return None
    return words[0]


def _python_entries(args: Sequence[str], cwd: str) -> list[Entry]:
    """What ``python ARGS`` runs: a script, a module (-m), or code we cannot see (-c, -).
    A module is followed by the first ``.py`` file among its arguments, for a launcher
    run as one (``python -m torch.distributed.run ... train.py``)."""
    it = iter(args)
    for a in it:
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            name = a[2:] or next(it, "")
            return [("module", name), *_launcher_entries(list(it), cwd)] if name else []
        if a == "-" or (a.startswith("-c") and not a.startswith("--")):
            return []
        if a in ARG_OPTIONS:
            next(it, None)
        elif not a.startswith("-"):
            return [("file", a)]
    return []


def _launcher_entries(args: Sequence[str], cwd: str) -> list[Entry]:
    """A launcher's (torchrun, accelerate launch, deepspeed) script: its first argument
    that is a ``.py`` file there (a module it runs with ``-m`` is not told apart from an
    option's value, and is left alone)."""
    for a in args:
        if a.endswith(".py") and not a.startswith("-") and os.path.isfile(os.path.join(cwd, a)):
            return [("file", a)]
    return []
