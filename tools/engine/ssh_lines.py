"""Runs ssh (or any command) and hands on its stdout and stderr with every line cut at MAX_LINE_BYTES.

The SSH transport fans out through ClusterShell, which keeps a partial line in memory until its newline comes
(and copies the buffer at every read): a node that prints one endless line would grow our memory and CPU
without bound. The nodes of a sweep are not trusted, so the transport runs each ssh under this filter
(transport.SshTransport sets it as ClusterShell's ssh_path): what reaches ClusterShell is lines of at most
MAX_LINE_BYTES, a longer line cut there with a mark and the rest of it dropped up to its newline. The exit
status is ssh's; a signal that ends this filter ends ssh too (PR_SET_PDEATHSIG), so a cancelled step leaves
no ssh behind.

    python -m tools.engine.ssh_lines ssh -T ... host command
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading

MAX_LINE_BYTES = 1 << 20       # a side-channel event or a report line; processes.MAX_LINE_BYTES caps srun's at 8 MiB
CHUNK = 64 << 10
CUT_MARK = b" ...[line cut by mleng]\n"
PR_SET_PDEATHSIG = 1


def copy_capped(source, sink, limit: int = MAX_LINE_BYTES) -> None:
    """Copy `source` to `sink` (binary files), cutting every line at `limit` bytes."""
    length = 0          # bytes of the current line written so far
    dropping = False    # past the limit: drop until the newline
    while True:
        chunk = source.read1(CHUNK) if hasattr(source, "read1") else source.read(CHUNK)
        if not chunk:
            break
        out = []
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline + 1
            part = chunk[start:end]
            if not dropping:
                room = limit - length
                if len(part) - (newline >= 0) > room:     # this part would pass the limit
                    out.append(part[:room] + CUT_MARK)
                    dropping = newline < 0
                    length = 0
                else:
                    out.append(part)
                    length = 0 if newline >= 0 else length + len(part)
            elif newline >= 0:
                dropping = False
                length = 0
            start = end
        if out:
            sink.write(b"".join(out))
            sink.flush()


def _die_with_parent() -> None:
    """In ssh, before exec: the kernel sends it SIGTERM when this filter ends, however it ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tools.engine.ssh_lines COMMAND [ARGS...]", file=sys.stderr)
        return 2
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    copies = [threading.Thread(target=copy_capped, args=(stream, sink), daemon=True)
              for stream, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]
    for copy in copies:
        copy.start()
    code = proc.wait()
    for copy in copies:
        copy.join()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
