"""`trainctl gpus`: every GPU, its lease, and who is on it."""

from __future__ import annotations

from trainctl.launcher import render
from trainctl.launcher.exitcodes import ExitCode
from trainctl.launcher.gpus import gpu_inventory
from trainctl.supervisor.errors import GpuError
from trainctl.supervisor.gpu import NoDriverError

from . import Invocation


def run(inv: Invocation, *, as_json: bool = False) -> int:
    """Print the GPUs; without an NVIDIA driver, one line and exit 0.

    When NVML as a whole cannot answer (a version mismatch, no permission), one line
    that says why, exit 1; ``--json`` still prints a document. One GPU that cannot be
    read is a row with its error, and the others are shown as usual.
    """
    try:
        inventory = gpu_inventory(inv.home)
    except NoDriverError as e:
        render.emit_json({"gpus": [], "error": str(e)}) if as_json else render.line(str(e))
        return ExitCode.OK
    except GpuError as e:
        if as_json:
            render.emit_json({"gpus": [], "error": str(e)})
        else:
            render.error_line(str(e))
        return ExitCode.FAILED
    if as_json:
        render.emit_json(inventory.to_doc())
    else:
        render.gpus(inventory)
    return ExitCode.OK
