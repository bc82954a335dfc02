"""supervisor/ in rooms (issue 45): a few packages by responsibility, imports only downward.

The picture is in docs/design.md ("The supervisor's rooms"). From the floor up:

- ``errors``, ``ids``, ``records``: the floor, importable from every room;
- ``linux``: the kernel's interfaces (/proc, pidfd polls, cgroups, D-Bus, systemd);
- ``model``: what a run is and leaves on disk (spec, state, reports, control records);
- ``gpu``: the driver, the fake, holders, the release proof, the run's GPU watch;
- ``tree``: the job's processes (launch, find every member, stop them);
- ``life``: the run's life (the lifecycle owner, causes, policy, hooks);
- ``watch``: the watchers' own logic (drift, stall, samples, the log's stamps and bound);
- the top level: the supervisor's parts that wire the rooms together, and its entry points.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SUPERVISOR = Path(__file__).parents[2] / "supervisor"
FLOOR = {"errors", "ids", "records"}
ROOMS = ["linux", "model", "gpu", "tree", "life", "watch"]
TOP = len(ROOMS)


def room_of(module: str) -> int:
    """-1 for the floor, the room's index, or TOP for the top level's other modules."""
    head = module.split(".", maxsplit=1)[0]
    if head in FLOOR or module == "":
        return -1
    return ROOMS.index(head) if head in ROOMS else TOP


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SUPERVISOR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every (line, supervisor module) ``path`` imports, resolved to a dotted name."""
    me = module_of(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                base += node.module.split(".") if node.module else []
            elif node.module and node.module.startswith("trainctl.supervisor"):
                rest = node.module.removeprefix("trainctl.supervisor").lstrip(".")
                base = rest.split(".") if rest else []
            else:
                continue
            for alias in node.names:
                sub = SUPERVISOR.joinpath(*base, alias.name)
                is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                out.append((node.lineno, ".".join([*base, alias.name] if is_module else base)))
        elif isinstance(node, ast.Import):
            out += [
                (node.lineno, a.name.removeprefix("trainctl.supervisor."))
                for a in node.names
                if a.name.startswith("trainctl.supervisor.")
            ]
    return out


FILES = sorted(SUPERVISOR.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SUPERVISOR)))
def test_rooms_import_only_downward(path: Path) -> None:
    mine = room_of(module_of(path))
    for line, target in imports_of(path):
        theirs = room_of(target)
        same = target.split(".")[0] == module_of(path).split(".")[0]
        assert theirs < mine or same or mine == TOP, (
            f"supervisor/{path.relative_to(SUPERVISOR)}:{line} imports {target}: a room "
            f"imports only the floor, itself and the rooms below it ({' < '.join(ROOMS)})"
        )


def test_the_top_level_is_small_and_every_module_is_in_a_room() -> None:
    top = sorted(p.stem for p in SUPERVISOR.glob("*.py"))
    assert len(top) <= 15, top
    rooms = sorted(p.parent.name for p in SUPERVISOR.glob("*/__init__.py"))
    assert rooms == sorted(ROOMS), f"a new package belongs in ROOMS, at its floor: {rooms}"


def test_the_resolver_sees_imports() -> None:
    """The check above is not vacuous: the lifecycle imports the model, the stop the GPU."""
    assert "model.state" in {t for _, t in imports_of(SUPERVISOR / "life" / "lifecycle.py")}
    assert "gpu.verify" in {t for _, t in imports_of(SUPERVISOR / "tree" / "stop.py")}
    assert room_of("gpu.verify") < room_of("tree.stop") < room_of("core")


MAX_DEPTH = 8  # issue 45: "import depth <= 8 levels" (it had grown from 8 to 11)


def _module_level(path: Path) -> set[str]:
    """The supervisor modules ``path`` imports when it is imported: its top-level imports,
    not those under ``if TYPE_CHECKING`` (types only) nor inside functions (when called)."""
    body = [
        n
        for n in ast.parse(path.read_text()).body
        if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    ]
    lines = {n.lineno for n in body if isinstance(n, ast.Import | ast.ImportFrom)}
    me = module_of(path)
    return {t for line, t in imports_of(path) if line in lines and t and t != me}


def _depths() -> dict[str, tuple[int, list[str]]]:
    """Each module's import depth (itself 1, plus its deepest import) and that chain."""
    graph = {module_of(p): _module_level(p) for p in FILES}
    memo: dict[str, tuple[int, list[str]]] = {}

    def depth(m: str, trail: tuple[str, ...]) -> tuple[int, list[str]]:
        if m in memo:
            return memo[m]
        deps = [d for d in graph.get(m, ()) if d in graph and d not in trail]
        best = max((depth(d, (*trail, m)) for d in deps), default=(0, []))
        memo[m] = (best[0] + 1, [m, *best[1]])
        return memo[m]

    return {m: depth(m, ()) for m in graph}


def test_the_import_chain_is_at_most_eight_modules_deep() -> None:
    deepest, chain = max(_depths().values())
    assert deepest <= MAX_DEPTH, " -> ".join(chain)


def test_the_depth_check_sees_chains() -> None:
    """Not vacuous: the service sits on a chain down to the floor (errors, records)."""
    depth, chain = _depths()["service"]
    assert depth >= 5, chain
    assert chain[-1] in FLOOR, chain
