"""A host's end of ranks started over ssh (shared/launch_ssh.py), run under engine/remote_step.py:

    python -m <pkg>.shared.torchrun_on_host RDZV_HOST -- python -m torch.distributed.run ... -m MODULE ARGS

Runs the torchrun command with `--rdzv-conf=is_host=1` on the host the caller chose for the rendezvous
and 0 on the others. Which host this is comes from MLENG_NODE, which remote_step sets to the name ssh
reached this host by (the caller's word, not this host's): torchrun's own guess from hostnames and
addresses is wrong where one machine answers for several names, or where the address others dial is
not one of this host's own (NAT). The ranks get a private TMPDIR, removed when torchrun ends
(torchelastic leaves a folder per run there), OMP_NUM_THREADS=1 unless set, and unbuffered output so
their events come as they are written. Exits with torchrun's status.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from ..engine.on_node import NODE_ENV, NODE_PATTERN
from .scratch import LockedScratch

TORCHRUN_MODULE = "torch.distributed.run"


def with_is_host(argv: list[str], rdzv_host: str, this_host: str) -> list[str]:
    """The torchrun argv with is_host set: 1 on the rendezvous host, 0 elsewhere."""
    at = argv.index(TORCHRUN_MODULE) + 1
    return [*argv[:at], f"--rdzv-conf=is_host={int(this_host == rdzv_host)}", *argv[at:]]


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not re.fullmatch(NODE_PATTERN, args[0]) or TORCHRUN_MODULE not in args:
        print("usage: torchrun_on_host RDZV_HOST -- PYTHON -m torch.distributed.run ...", file=sys.stderr)
        return 2
    argv = with_is_host(args[2:], args[0], os.environ.get(NODE_ENV, ""))
    scratch = LockedScratch("mleng-ranks-ssh-")
    env = {**os.environ, "TMPDIR": scratch.path, "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        child = subprocess.Popen(argv, env=env)
        # remote_step signals the whole group: torchrun stops its ranks, and this waits for it to remove the folder
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        code = child.wait()
    finally:
        scratch.remove()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
