# Sourced by the scripts: create .venv and install trainctl (+ extras) into it, once.
# Usage: [EXTRAS=test] . scripts/_venv.sh  (a variable, not $1: sourcing passes the
# caller's arguments along)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
extras="${EXTRAS:-}"
stamp="$VENV/.installed-${extras:-base}"
_pip() {  # quiet unless it fails
  local log; log="$(mktemp)"
  if ! "$VENV/bin/python" -m pip install -q "$@" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; return 1
  fi
  rm -f "$log"
}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Strict editable installs link each packaged file: a new or removed module needs a
# re-link. The list of packaged files (and pyproject.toml, and the `trainctl` script, which
# is copied, not linked) is the install's signature; when it is unchanged, pip is skipped.
files_sig="$(cd "$ROOT" && { find supervisor launcher conf -name '*.py' -o -name '*.toml' \
  -o -name py.typed | sort; sha1sum pyproject.toml bin/trainctl; } | sha1sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  spec="$ROOT"; [ -n "$extras" ] && spec="$ROOT[$extras]"
  # strict editable install: exactly the packaged files, as mypy and users see them
  _pip -e "$spec" --config-settings editable_mode=strict
  echo "$files_sig" >"$stamp"
elif [ "$(cat "$stamp")" != "$files_sig" ]; then
  _pip --no-deps -e "$ROOT" --config-settings editable_mode=strict
  echo "$files_sig" >"$stamp"
fi
# PyTorch for the real-framework tests, but only its CPU build from this machine's disk
# (--no-index): from PyPI, torch==2.13.0 is a CUDA build of several GB.
torch_stamp="$VENV/.installed-torch"
# (again when pyproject.toml changed: the extra also brings transformers and lightning)
if [ "$extras" = test ] && { [ ! -f "$torch_stamp" ] || [ "$ROOT/pyproject.toml" -nt "$torch_stamp" ]; }; then
  if "$VENV/bin/python" -m pip install -q --no-index --no-deps "torch==2.13.0" >/dev/null 2>&1
  then
    _pip -e "$ROOT[torch]" --config-settings editable_mode=strict  # its deps; torch is there
    touch "$torch_stamp"
  else
    echo "note: no CPU wheel of torch==2.13.0 on this machine: the PyTorch tests will skip" >&2
  fi
fi
# Byte-compile the linked tree: with PYTHONDONTWRITEBYTECODE set (as on these machines)
# every `trainctl` call would otherwise recompile its modules from source (~20 ms).
"$VENV/bin/python" -m compileall -q "$ROOT"/build/__editable__.trainctl-*/trainctl >/dev/null
export PATH="$VENV/bin:$PATH"
