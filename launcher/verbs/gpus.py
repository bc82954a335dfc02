"""`trainctl gpus`: every GPU, its lease, and who is on it."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.gpus import gpu_inventory
from trainctl.supervisor.errors import ConfigError, GpuError
from trainctl.supervisor.gpu import NoDriverError, health

from . import Invocation


def run(inv: Invocation, *, as_json: bool = False, all_hosts: bool = False) -> int:
    """Print the GPUs; without an NVIDIA driver, one line and exit 0.

    When NVML as a whole cannot answer (a version mismatch, no permission), one line
    that says why, exit 1; ``--json`` still prints a document. One GPU that cannot be
    read is a row with its error, and the others are shown as usual.
    """
    if all_hosts:
        return _all_hosts(inv, as_json=as_json)
    try:
        inventory = gpu_inventory(inv.home)
    except NoDriverError as e:
        inv.reply({"gpus": [], "error": str(e)}) if as_json else render.line(str(e))
        return ExitCode.OK
    except GpuError as e:
        if as_json:
            inv.reply({"gpus": [], "error": str(e)})
        else:
            render.error_line(str(e))
        return ExitCode.FAILED
    if as_json:
        inv.reply(inventory.to_doc())
    else:
        render.show(render.gpus(inventory))
    return ExitCode.OK


def _all_hosts(inv: Invocation, *, as_json: bool) -> int:
    """Free and held GPUs per host of hosts.toml: where the next job fits."""
    from trainctl.launcher.ops.fleet import over_hosts  # noqa: PLC0415  (ssh, threads)

    answers = over_hosts(["gpus"])
    if as_json:
        inv.reply([a.to_doc() for a in answers])
    else:
        render.show(render.fleet_gpus(answers))
    return ExitCode.OK if all(a.error is None for a in answers) else ExitCode.REMOTE


def clear(inv: Invocation, index: int, *, as_json: bool = False) -> int:
    """`gpus --clear N`: GPU N is healthy again (a person says so, after a reset)."""
    if index < 0:
        raise ConfigError(f"--clear {index}: a GPU index is 0 or more")
    was = health.unhealthy(inv.home).get(index)
    cleared = health.clear(inv.home, index)
    if as_json:
        inv.reply({"gpu": index, "cleared": cleared, "was": was.line() if was else None})
    elif cleared:
        render.line(f"GPU {index} is marked healthy again (it was {was.line() if was else '?'})")
    else:
        render.line(f"GPU {index} was not marked unhealthy; nothing changed")
    return ExitCode.OK
