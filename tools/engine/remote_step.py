"""The node's end of an SSH step (engine/transport.py): `python -m <pkg>.engine.remote_step NODE -- ARGV...`.

Runs ARGV in a process group of its own, with MLENG_NODE=NODE (the name the caller reached this node
by, which the node then reports), and kills that group when the connection closes. sshd sends a
command that has no terminal no signal when the client goes away, so without this a step cut at
its deadline, or cancelled, would keep running on the node. The connection's end is seen on stdout:
sshd closes its end of that pipe, and poll() reports an error on ours. stdin is the command's own
(the `node=` option sends the tool's params on it). Exits with the command's status.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading

# Defined here, not in on_node: each node of an SSH step starts this module before its command, all at once,
# and on_node's imports (the tool contract, pydantic) cost 0.15 CPU-s a start (a fleet_sweep over 8 hosts at
# load 20 on 2 cores started its first check 12 s after the call over ssh, 2 s through srun; docs/benchmarks.md).
NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$"
NODE_ENV = "MLENG_NODE"   # set for the child: it then reports the node's own host provenance

GRACE_S = 5


def stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to the command's whole group, SIGKILL after a grace period."""
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def watch_connection(child: subprocess.Popen) -> None:
    """Wait until the reader of our stdout (sshd) is gone, then stop the command."""
    watch = select.poll()
    watch.register(1, 0)     # no event asked for: poll still reports POLLERR/POLLHUP, and only those
    while not watch.poll():
        pass
    stop_group(child)


def main(args: list[str]) -> int:
    import re

    if len(args) < 3 or args[1] != "--" or not re.fullmatch(NODE_PATTERN, args[0]):
        print("usage: remote_step NODE -- ARGV...", file=sys.stderr)
        return 2
    child = subprocess.Popen(args[2:], start_new_session=True,
                             env={**os.environ, NODE_ENV: args[0]})
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_group(child))
    threading.Thread(target=watch_connection, args=(child,), daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
