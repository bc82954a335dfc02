"""The new code's look before a deploy stops the old run, run by the job's own interpreter.

Run as ``PYTHON -c <this file's text> JSON`` (launcher/codecheck.py), where JSON is
``{"cwd": ..., "entries": [["file", PATH] | ["module", NAME], ...]}``. It prints one JSON
object: ``{"problems": [...], "files": N, "imports": N, "unchecked": REASON | null,
"followed": [[FILE, "file:line" | null], ...], "python": "3.N"}`` (the files it read and
the import that brought each, for the git snapshot's look; its own version).

It executes none of the job's code and imports none of its packages: each Python file it
reaches (the entry script, then the modules beside it that it imports at module level,
and theirs) is compiled, and each module-level import that is not one of those files is
looked for with ``importlib.util.find_spec`` on its top-level name, which finds a
package without running it. So it sees what fails a new run in its first seconds for
certain (a syntax error, an import of a module that is not installed or not there), in
the Python that will run it, and nothing else.

What it leaves alone, so that it never refuses code that would have run: imports under
``try``, ``if`` or in a function (optional, conditional or late); relative imports it
cannot place; ``from X import name`` where name may be an attribute; submodules of
installed packages (looking would import the package); a missing module imported after
a call at module level (a code generator, ``pyximport.install()``: the call may make it);
and every missing module when a file it reached changes ``sys.path`` or the import
machinery (the module may be found where that puts it).

Standard library only, and Python 3.6's syntax (no walrus, no ``X | Y``): the job's
interpreter may be older than trainctl's.
"""

import ast
import json
import os
import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

    Where = tuple[str, int]  # a file and the line of an import in it

MAX_FILES = 400  # a monorepo's entry imports much: the look stays a look
# text that may change where (or whether) a later import finds its module
DYNAMIC = (
    b"sys.path",
    b"addsitedir",
    b"meta_path",
    b"path_hooks",
    b"__path__",
    b"sys.modules",
    b"pyximport",
    b"importlib.machinery",
    b"declare_namespace",
)


class FOUND:  # stands for a spec where looking raised: counted as found
    origin = "?"


def main() -> None:
    order = json.loads(sys.argv[1])
    os.chdir(order["cwd"])
    # a slot of our own in front, for the folder a run puts there (its script's, or the
    # cwd for -m); `-c` put '' first, and PYTHONSAFEPATH nothing: neither is replaced
    sys.path.insert(0, os.getcwd())
    look = Look()
    for kind, what in order["entries"]:
        if kind == "file":
            path = os.path.abspath(what)
            look.follow(path, os.path.dirname(path))  # sys.path[0] of `python FILE`
        else:
            look.module(what, os.getcwd(), None)  # `python -m NAME`: the cwd
            main_py = os.path.join(os.getcwd(), *what.split("."), "__main__.py")
            if os.path.isfile(main_py):  # a package run with -m runs its __main__
                look.follow(main_py, os.getcwd())
    look.drain()
    look.report()


class Look:
    def __init__(self) -> None:
        self.queue = []  # type: list[tuple[str, str]]  # (path, root)
        # each file followed: the import that brought it (None: an entry)
        self.via = {}  # type: dict[str, Where | None]
        self.problems = []  # type: list[str]
        self.missing = []  # type: list[tuple[Where | None, str]]  # modules not found
        self.imports = 0
        self.dynamic = None  # type: str | None  # the first file that moves sys.path
        self.late = None  # type: Where | None  # the first import after a call at top level
        self.after_call = None  # type: Where | None  # the import under way, when late
        self.late_n = 0

    def follow(self, path: str, root: str, where: "Where | None" = None) -> None:
        if path not in self.via and len(self.via) < MAX_FILES:
            self.via[path] = where
            self.queue.append((path, root))

    def drain(self) -> None:
        while self.queue:
            path, root = self.queue.pop(0)
            self.read(path, root)

    def read(self, path: str, root: str) -> None:
        try:
            with open(path, "rb") as f:
                src = f.read()
        except OSError as e:
            self.problems.append(f"{self.rel(path)}: {e.strerror}")
            return
        try:
            compile(src, path, "exec", dont_inherit=True)
            tree = ast.parse(src, path)
        except SyntaxError as e:
            where = f"{self.rel(path)}:{e.lineno}" if e.lineno else self.rel(path)
            self.problems.append(f"{where}: {type(e).__name__}: {e.msg}")
            return
        except ValueError as e:  # a NUL byte
            self.problems.append(f"{self.rel(path)}: {e}")
            return
        if self.dynamic is None and any(d in src for d in DYNAMIC):
            self.dynamic = self.rel(path)
        ran = False  # a statement before this one called something (codegen, an installer)
        for node in tree.body:  # module level, unconditional
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.after_call = (path, node.lineno) if ran else None
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        self.module(alias.name, root, (path, node.lineno))
                else:
                    self.from_import(node, path, root)
            elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ran = ran or any(isinstance(n, ast.Call) for n in ast.walk(node))
        self.after_call = None

    def from_import(self, node: ast.ImportFrom, path: str, root: str) -> None:
        if node.level:  # relative: placed against this file's package, when it is one
            base = os.path.dirname(path)
            for _ in range(node.level - 1):
                base = os.path.dirname(base)
            where = (path, node.lineno)
            if node.module:
                self.local(os.path.join(base, *node.module.split(".")), root, where)
            for alias in node.names:
                name = os.path.join(base, *(node.module or "").split("."), alias.name)
                self.local(name, root, where)
            return
        module = node.module or ""  # absolute: always named
        if self.module(module, root, (path, node.lineno)):
            for alias in node.names:  # a submodule of a local package, else an attribute
                name = os.path.join(root, *module.split("."), alias.name)
                self.local(name, root, (path, node.lineno))

    def module(self, name: str, root: str, where: "Where | None") -> bool:
        """Place ``name`` beside the code (follow it) or among the installed modules;
        True when it is the code's own."""
        self.imports += where is not None
        parts = name.split(".")
        top = os.path.join(root, parts[0])
        regular = os.path.isfile(top + ".py") or os.path.isfile(os.path.join(top, "__init__.py"))
        if not regular:
            spec = self.find(parts[0], root)
            if spec is None and not os.path.isdir(top):
                if self.after_call is not None:  # what the call did may have made it
                    self.late = self.late or self.after_call
                    self.late_n += 1
                else:
                    self.missing.append((where, parts[0]))
            if spec is None or spec.origin is not None or not os.path.isdir(top):
                return False  # installed (it wins over a folder of that name), or missing
        for i in range(1, len(parts) + 1):  # the code's own: each part followed
            if self.local(os.path.join(root, *parts[:i]), root, where):
                continue
            init = os.path.join(root, *parts[: i - 1], "__init__.py")
            if where is not None and os.path.isfile(init) and not self.extends_path(init):
                self.problems.append(f"{self.at(where)}: No module named {'.'.join(parts[:i])!r}")
            break
        return True

    def find(self, name: str, root: str) -> "ModuleSpec | type[FOUND] | None":
        """The spec of top-level module ``name`` as the run would find it (None: none)."""
        sys.path[0] = root  # the slot main() made
        try:
            return find_spec(name)
        except Exception:  # noqa: BLE001  # a finder of the job's that fails: not ours to judge
            return FOUND

    def local(self, path: str, root: str, where: "Where | None") -> bool:
        """Follow the module at ``path`` (without .py): a file, or a package's
        ``__init__``; a namespace package (a folder) counts as found."""
        if os.path.isfile(path + ".py"):
            self.follow(path + ".py", root, where)
            return True
        if os.path.isdir(path):
            init = os.path.join(path, "__init__.py")
            if os.path.isfile(init):
                self.follow(init, root, where)
            return True
        return False

    def extends_path(self, init: str) -> bool:
        try:
            with open(init, "rb") as f:
                return any(d in f.read() for d in DYNAMIC)
        except OSError:
            return False

    def at(self, where: "Where") -> str:
        path, line = where
        return f"{self.rel(path)}:{line}"

    def rel(self, path: str) -> str:
        try:
            rel = os.path.relpath(path)
        except ValueError:
            return path
        return path if rel.startswith("..") else rel

    def report(self) -> None:
        for where, name in self.missing:
            if self.dynamic is None:
                at = self.at(where) if where else "-m"
                self.problems.append(f"{at}: No module named {name!r}")
        unchecked = None
        if self.dynamic is not None and (self.missing or self.late is not None):
            n = len(self.missing) + self.late_n
            unchecked = (
                f"{self.dynamic} changes sys.path: {n} import(s) not found here left to the run"
            )
        elif self.late is not None:
            unchecked = (
                f"{self.at(self.late)} imports a module not found here after a call that "
                "may make it: left to the run"
            )
        out = {
            "problems": self.problems,
            "files": len(self.via),
            "imports": self.imports,
            "unchecked": unchecked,
            "followed": [
                [self.rel(p), self.at(w) if w else None] for p, w in sorted(self.via.items())
            ],
            "python": "{}.{}".format(*sys.version_info[:2]),
        }
        sys.stdout.write(json.dumps(out) + "\n")


main()
