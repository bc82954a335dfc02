"""A job whose processes hold (fake) GPUs: main, a forked child, a setsid-escaped daemon and
a dataloader grandchild each keep $FAKE_DEV_DIR/nvidia<i> open for every GPU i in
CUDA_VISIBLE_DEVICES, the way CUDA processes keep /dev/nvidia<i> open (MIG-<uuid> for a
MIG instance).

Usage: gpu_holders.py [--ignore-term]. Each holder's fake memory is $FAKE_GPU_MIB.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ready, wait_files  # noqa: E402

if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
# A MIG instance is named by its MIG-<uuid>: its stand-in node is $FAKE_DEV_DIR/MIG-<uuid>.
devs = [f"{os.environ['FAKE_DEV_DIR']}/{i if i.startswith('MIG-') else 'nvidia' + i}"
        for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i]


def hold(flag: str) -> None:
    fds = [os.open(d, os.O_RDWR) for d in devs]  # kept open: the "CUDA context"
    open(flag, "w").close()
    forever()
    del fds


flags = [child_flag(n) for n in ("child", "daemon", "grandchild")]
if os.fork() == 0:
    hold(flags[0])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        hold(flags[1])
    os._exit(0)
if os.fork() == 0:  # a rank that holds nothing, with a dataloader worker that does
    if os.fork() == 0:
        hold(flags[2])
    forever()
wait_files(flags)
main_flag = child_flag("main")
fds = [os.open(d, os.O_RDWR) for d in devs]
ready()
forever()
