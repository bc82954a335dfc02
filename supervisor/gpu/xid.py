"""What a GPU fault asks for: NVIDIA's own action for each Xid, in one table.

Source: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Catalog":
its Resolution column, RESTART_APP / RESET_GPU / RESTART_BM / IGNORE ...), the column
NVIDIA's NVSentinel (github.com/NVIDIA/NVSentinel, its syslog health monitor) maps each
Xid through to a remediation. The classes here are that column, collapsed to what a
training run on one box can do about it:

- ``restart-app``: the application faulted (or was hit by a contained error); the GPU is
  fine: restart the run. It counts toward the restart policy's breakers, as any crash.
- ``reset-gpu``: the GPU must be reset before it is used again.
- ``reboot``: the GPU is gone until the machine reboots (fallen off the bus).
- ``info``: informational; nothing to do.

An Xid not in the table is shown with its number and classed ``unknown``: never guessed.
NVML's GPU recovery action (the field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, read with
``nvmlDeviceGetFieldValues``; drivers 550+), where the driver reports one, overrides the
table for that GPU (:func:`from_recovery`): the driver knows what this very fault needs.
"""

from __future__ import annotations

from trainctl.supervisor.records import record

RESTART_APP = "restart-app"
RESET_GPU = "reset-gpu"
REBOOT = "reboot"
INFO = "info"
UNKNOWN = "unknown"

# The classes whose GPU is unhealthy (no run is handed it until it is healthy again)
UNHEALTHY = (RESET_GPU, REBOOT)

# xid -> (class, what it is). The catalog's Resolution column, per the examples
# (13, 31, 94: restart the application; 64, 95, 119: reset; 79: reboot; 43, 63, 92: info)
# and the catalog's entries for the rest listed here.
TABLE: dict[int, tuple[str, str]] = {
    8: (RESTART_APP, "GPU stopped processing"),
    13: (RESTART_APP, "graphics engine exception"),
    31: (RESTART_APP, "GPU memory page fault"),
    32: (RESTART_APP, "invalid or corrupted push buffer stream"),
    43: (INFO, "GPU stopped processing (the application's own fault, handled)"),
    45: (INFO, "preemptive cleanup, due to a previous error"),
    48: (RESET_GPU, "double-bit ECC error"),
    61: (RESET_GPU, "internal micro-controller breakpoint/warning"),
    62: (RESET_GPU, "internal micro-controller halt"),
    63: (INFO, "ECC page retirement or row remap recorded"),
    64: (RESET_GPU, "ECC page retirement or row remap failure"),
    68: (RESTART_APP, "video processor exception"),
    69: (RESTART_APP, "graphics engine class error"),
    74: (RESET_GPU, "NVLink error"),
    79: (REBOOT, "GPU has fallen off the bus"),
    92: (INFO, "high single-bit ECC error rate"),
    94: (RESTART_APP, "contained ECC error"),
    95: (RESET_GPU, "uncontained ECC error"),
    109: (RESTART_APP, "context switch timeout"),
    119: (RESET_GPU, "GSP RPC timeout"),
    120: (RESET_GPU, "GSP error"),
    121: (INFO, "C2C link corrected error"),
    140: (RESET_GPU, "ECC unrecovered error"),
    154: (REBOOT, "GPU recovery action changed: a reboot is needed"),
}

# NVML's nvmlGpuRecoveryAction_t (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, nvml.h): NONE 0,
# GPU_RESET 1, NODE_REBOOT 2, DRAIN_P2P 3, DRAIN_AND_RESET 4, RECOVER_IMEX_DOMAIN 5,
# BUS_RESET 6, SYSTEM_REBOOT 7 -> (class, what the driver asks). An IMEX domain to recover
# is the multi-node fabric's, not this GPU's health: the run restarts, the GPU stays in.
RECOVERY: dict[int, tuple[str, str] | None] = {
    0: None,
    1: (RESET_GPU, "the driver asks for a GPU reset"),
    2: (REBOOT, "the driver asks for a reboot"),
    3: (RESET_GPU, "the driver asks to drain peer-to-peer traffic and reset"),
    4: (RESET_GPU, "the driver asks to drain and reset"),
    5: (RESTART_APP, "the driver asks to recover the IMEX domain"),
    6: (RESET_GPU, "the driver asks for a bus reset"),
    7: (REBOOT, "the driver asks for a system reboot"),
}
ACTION_WORDS = {
    RESTART_APP: "restart the application",
    RESET_GPU: "GPU reset needed",
    REBOOT: "reboot needed",
    INFO: "informational",
    UNKNOWN: "not in NVIDIA's catalog here: not acted on",
}


@record(frozen=True)
class Fault:
    """One GPU fault, classed."""

    gpu: int
    xid: int | None  # None: not an Xid (the GPU is lost, an ECC count rose)
    klass: str
    what: str

    @property
    def unhealthy(self) -> bool:
        """The GPU must not be handed to a run until it is healthy again."""
        return self.klass in UNHEALTHY

    def line(self, at: str) -> str:
        """``GPU 2 Xid 79 (GPU has fallen off the bus; reboot needed) at 03:12:00``."""
        xid = f" Xid {self.xid}" if self.xid is not None else ""
        return f"GPU {self.gpu}{xid} ({self.what}; {ACTION_WORDS[self.klass]}) at {at}"


def classify(gpu: int, xid: int) -> Fault:
    """Class an Xid by the table; an unknown one keeps its number and is not guessed at."""
    klass, what = TABLE.get(xid, (UNKNOWN, "an Xid trainctl does not know"))
    return Fault(gpu, xid, klass, what)


def lost(gpu: int, why: str) -> Fault:
    """A GPU the driver cannot reach (GPU_IS_LOST, unavailable): gone until a reboot."""
    return Fault(gpu, None, REBOOT, why)


def from_recovery(gpu: int, action: int, fault: Fault | None = None) -> Fault | None:
    """NVML's recovery action for ``gpu``, where the driver reports one, over the table:
    None for NONE; an action this table does not know keeps its number, never guessed."""
    if action not in RECOVERY:
        klass, asks = UNKNOWN, f"the driver reports recovery action {action}"
    else:
        known = RECOVERY[action]
        if known is None:
            return None
        klass, asks = known
    what = f"{fault.what}; {asks}" if fault is not None else asks
    return Fault(gpu, fault.xid if fault else None, klass, what)
