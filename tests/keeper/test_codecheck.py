"""The look at new code before a deploy stops anything (launcher/codecheck.py): real
interpreters run the probe on real files; what it must find, and what it must leave alone
so that it never refuses code that would have run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.launcher import codecheck

ENV = dict(os.environ)
PY = sys.executable


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def problems(root: Path, *argv: str) -> list[str]:
    seen = codecheck.check(list(argv), str(root), ENV)
    assert seen.unchecked is None, seen
    return seen.problems


def test_a_syntax_error_and_a_missing_module_are_found_with_file_and_line(tmp_path: Path) -> None:
    tree(tmp_path, {
        "train.py": "import os\nfrom model import Net\nimport pkg.util\nprint('go')\n",
        "model.py": "import json\nimport flash_attn_not_installed\nclass Net: pass\n",
        "pkg/__init__.py": "",
        "pkg/util.py": "def f(:\n",
    })  # fmt: skip
    found = problems(tmp_path, PY, "-u", "train.py", "--lr", "3")
    assert sorted(found) == [
        "model.py:2: No module named 'flash_attn_not_installed'",
        "pkg/util.py:1: SyntaxError: invalid syntax",
    ]


def test_a_good_tree_has_no_problem_and_says_what_it_looked_at(tmp_path: Path) -> None:
    tree(tmp_path, {
        "train.py": "import os, json\nfrom pkg import model\nfrom pkg.data import load\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "import math\nfrom . import layers\n",
        "pkg/layers.py": "import collections\n",
        "pkg/data.py": "def load(): pass\n",
    })  # fmt: skip
    seen = codecheck.check([PY, "train.py"], str(tmp_path), ENV)
    assert seen.problems == []
    assert seen.files == 5  # train, the package, model, layers (relative), data
    assert seen.entry == "train.py"
    assert seen.version == "{}.{}".format(*sys.version_info[:2])


def test_what_the_run_might_not_need_is_left_alone(tmp_path: Path) -> None:
    tree(tmp_path, {
        "train.py": (
            "import sys\n"
            "try:\n    import apex_not_here\nexcept ImportError:\n    apex_not_here = None\n"
            "if sys.platform == 'nowhere':\n    import only_there\n"
            "def late():\n    import in_a_function\n"
            "if __name__ == '__main__':\n    import main_only\n"
            "from pkg import not_a_module  # an attribute of the package\n"
        ),
        "pkg/__init__.py": "not_a_module = 1\n",
    })  # fmt: skip
    assert problems(tmp_path, PY, "train.py") == []


def test_a_file_that_moves_sys_path_leaves_missing_modules_to_the_run(tmp_path: Path) -> None:
    tree(tmp_path, {
        "train.py": (
            "import os, sys\n"
            "sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'lib'))\n"
            "import helper\n"
        ),
        "lib/helper.py": "x = 1\n",
    })  # fmt: skip
    seen = codecheck.check([PY, "train.py"], str(tmp_path), ENV)
    assert seen.problems == []
    assert seen.unchecked is not None
    assert "train.py changes sys.path" in seen.unchecked


def test_a_folder_named_as_an_installed_package_is_not_taken_for_it(tmp_path: Path) -> None:
    # a run folder that shadows nothing (`json/` beside the script: the standard module
    # wins over a folder without __init__), and a namespace folder of the code's own
    tree(tmp_path, {
        "train.py": "import json.decoder\nimport runs.one\n",
        "json/garbage.py": "this is not python (\n",
        "runs/one.py": "x = 1\n",
    })  # fmt: skip
    assert problems(tmp_path, PY, "train.py") == []


def test_module_entries_and_a_missing_entry(tmp_path: Path) -> None:
    tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/__main__.py": "import pkg.gone\n",
        "pkg/train.py": "import not_installed_either\n",
    })  # fmt: skip
    assert problems(tmp_path, PY, "-m", "pkg") == ["pkg/__main__.py:1: No module named 'pkg.gone'"]
    assert problems(tmp_path, PY, "-m", "pkg.train") == [
        "pkg/train.py:1: No module named 'not_installed_either'"
    ]
    assert problems(tmp_path, PY, "-mnope_mod") == ["-m: No module named 'nope_mod'"]
    assert problems(tmp_path, PY, "renamed.py") == ["renamed.py: No such file or directory"]


def test_launchers_are_read_by_their_shebang(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "import not_installed_here\n", "conf.yaml": ""})
    launcher = tmp_path / "bin" / "mylaunch"
    launcher.parent.mkdir()
    launcher.write_text(f"#!{PY}\nimport sys\n")
    launcher.chmod(0o755)
    env_launcher = tmp_path / "bin" / "envlaunch"
    env_launcher.write_text("#!/usr/bin/env python3\nimport sys\n")
    env_launcher.chmod(0o755)
    shell = tmp_path / "bin" / "run.sh"
    shell.write_text("#!/bin/sh\nexec python3 train.py\n")
    shell.chmod(0o755)
    want = ["train.py:1: No module named 'not_installed_here'"]
    argv = ["--nproc-per-node", "2", "--config", "conf.yaml", "train.py", "--x", "1"]
    assert problems(tmp_path, str(launcher), *argv) == want
    env = {**ENV, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{ENV.get('PATH', '')}"}
    seen = codecheck.check(["envlaunch", *argv], str(tmp_path), env)
    assert seen.problems == want, seen
    for argv0, why in [
        (str(shell), "run.sh is not a Python program"),
        ("no-such-program-here", "no-such-program-here is not found on the job's PATH"),
    ]:
        seen = codecheck.check([argv0, "train.py"], str(tmp_path), ENV)
        assert (seen.problems, seen.unchecked) == ([], why)
    seen = codecheck.check([PY, "-c", "import nothing_at_all"], str(tmp_path), ENV)
    assert seen.unchecked == "no Python file named in the job's command"


def test_the_job_s_environment_decides_what_is_found(tmp_path: Path) -> None:
    tree(tmp_path, {"code/train.py": "import sidecar_mod\n", "extra/sidecar_mod.py": "x = 1\n"})
    code = tmp_path / "code"
    assert problems(code, PY, "train.py") == ["train.py:1: No module named 'sidecar_mod'"]
    env = {**ENV, "PYTHONPATH": str(tmp_path / "extra")}
    seen = codecheck.check([PY, "train.py"], str(code), env)
    assert seen.problems == []


def _python(version: str) -> str | None:
    """An interpreter of ``version`` that runs (a pyenv shim of one not selected fails)."""
    found = [*Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}")]
    for path in [*map(str, found), shutil.which(f"python{version}")]:
        if (
            path
            and subprocess.run([path, "-c", ""], capture_output=True, check=False).returncode == 0
        ):
            return path
    return None


@pytest.mark.parametrize("version", ["3.8", "3.12"])
def test_the_job_s_own_python_judges_the_syntax(tmp_path: Path, version: str) -> None:
    """The probe runs in the job's interpreter: 3.12's `type` statement is fine for a job
    on 3.12 (trainctl's own 3.11 would call it a syntax error), and `match` is an error
    for a job on 3.8 (3.11 would pass it)."""
    python = _python(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    tree(tmp_path, {
        "new.py": "type Alias = list[int]\n",
        "matching.py": "match 1:\n    case 1:\n        pass\n",
    })  # fmt: skip
    if version == "3.12":
        assert problems(tmp_path, python, "new.py") == []
    else:
        assert problems(tmp_path, python, "matching.py") == [
            "matching.py:1: SyntaxError: invalid syntax"
        ]


def test_a_safe_path_job_keeps_its_pythonpath(tmp_path: Path) -> None:
    """PYTHONSAFEPATH puts nothing first on sys.path: the look's own slot for the
    script's folder must not take the place of the job's PYTHONPATH."""
    tree(tmp_path, {"code/train.py": "import sidecar_mod\n", "extra/sidecar_mod.py": "x = 1\n"})
    env = {**ENV, "PYTHONPATH": str(tmp_path / "extra"), "PYTHONSAFEPATH": "1"}
    seen = codecheck.check([PY, "train.py"], str(tmp_path / "code"), env)
    assert (seen.problems, seen.unchecked) == ([], None)


def test_a_module_a_call_may_make_is_left_to_the_run(tmp_path: Path) -> None:
    """Code that makes a module before importing it (a code generator, an import hook
    installed by a call) must not be refused; a missing import before any call still is."""
    tree(tmp_path, {
        "gen.py": (
            "import os\n"
            "with open('made_now.py', 'w') as f:\n    f.write('x = 1\\n')\n"
            "import made_now\n"
        ),
        "hook.py": "import pyx_like\npyx_like.install()\nimport fastmod\n",
        "pyx_like.py": "def install(): pass\n",
        "early.py": "import not_there_at_all\nprint('go')\nimport made_later\n",
    })  # fmt: skip
    seen = codecheck.check([PY, "gen.py"], str(tmp_path), ENV)
    assert seen.problems == []
    assert seen.unchecked is not None
    assert seen.unchecked.startswith("gen.py:4 imports a module not found here after a call")
    seen = codecheck.check([PY, "hook.py"], str(tmp_path), ENV)
    assert (seen.problems, seen.unchecked is not None) == ([], True)
    seen = codecheck.check([PY, "early.py"], str(tmp_path), ENV)
    assert seen.problems == ["early.py:1: No module named 'not_there_at_all'"]
    # the look made nothing: gen.py was read, not run
    assert not (tmp_path / "made_now.py").exists()


def test_a_launcher_run_as_a_module_and_environment_switchers(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "import not_installed_here\n"})
    want = ["train.py:1: No module named 'not_installed_here'"]
    assert problems(tmp_path, PY, "-m", "json.tool", "--nproc", "2", "train.py") == want
    # `conda run -n env python train.py`, `poetry run torchrun train.py`: the Python that
    # runs the job is the environment's, not the one the switcher's own #! names
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("conda", "mytool"):
        (bin_dir / name).write_text(f"#!{PY}\nimport sys\n")
        (bin_dir / name).chmod(0o755)
    for argv in (
        [str(bin_dir / "conda"), "run", "-n", "env", "torchrun", "train.py"],
        [str(bin_dir / "mytool"), "run", "python3", "train.py"],
    ):
        seen = codecheck.check(argv, str(tmp_path), ENV)
        assert seen.problems == [], argv
        assert seen.unchecked is not None
        assert "runs the job in an environment of its own choosing" in seen.unchecked
