"""The code counts docs/design.md keeps (issue 55): `python3 scripts/counts.py`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [p for d in ("supervisor", "launcher") for p in sorted((ROOT / d).rglob("*.py"))]
LIVENESS_CALL = re.compile(r"\b(current_phase|effective_phase)\(")
LIVENESS_RAW = re.compile(r"\bin (state\.)?TERMINAL\b")


def main() -> None:
    dict_any = sum(p.read_text().count("dict[str, Any]") for p in FILES)
    long_fns, big = [], []
    for p in FILES:
        for n in ast.walk(ast.parse(p.read_text())):
            size = (n.end_lineno or n.lineno) - n.lineno + 1 if hasattr(n, "lineno") else 0
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and size > 50:
                long_fns.append(f"{n.name} ({size})")
            if isinstance(n, ast.ClassDef) and size > 300:
                big.append(f"{n.name} ({size})")
    calls = raw = 0
    for p in (ROOT / "launcher").rglob("*.py"):
        for line in p.read_text().splitlines():
            if "def " in line:
                continue
            calls += bool(LIVENESS_CALL.search(line))
            raw += bool(LIVENESS_RAW.search(line))
    writers = sorted(str(p.relative_to(ROOT)) for p in FILES if "write_state(" in p.read_text())
    print(f"dict[str, Any]: {dict_any}")
    print(f"functions over 50 lines: {len(long_fns)}: {', '.join(long_fns)}")
    print(f"classes over 300 lines: {', '.join(big) or 'none'}")
    print(f"liveness in launcher/: {calls} calls (the backend's view), {raw} raw TERMINAL tests")
    print(f"modules that call write_state: {', '.join(writers)}")
    spelt = sorted(str(p.relative_to(ROOT)) for p in FILES if '"state.json"' in p.read_text())
    print(f'modules that spell "state.json": {len(spelt)}: {", ".join(spelt)}')


if __name__ == "__main__":
    main()
