"""The node transport: how a step reaches other nodes, chosen per call (docs/architecture.md).

    hosts = node_set(["gpu-[01-16]"])                  # plain host names, or ValueError saying why
    ends = SshTransport().run_step(hosts, argv, deadline_s=60, on_line=lambda node, line: ...)
    ends["gpu-03"].how                                 # "exited" | "unreachable" | "silent"

A step is one argv started once on each of a set of nodes, all at once, under one deadline. Every
transport (`Transport` below) runs it the same way: each stdout line is handed on as
on_line(node, line), `node` being the one the transport started that part on (never what the line
says); lines it cannot tie to a node are counted in `refused`, not handed on; and each node's part
ends exactly once, as a NodeEnd: exited (with a status when known), unreachable (the transport could
not start it there: its words, naming the node) or silent (still running at the deadline or cancel:
cut there).

Two implementations: srun (engine/srun.py: one job step, one task per node) and SSH through
ClusterShell, here: ClusterShell does the fan-out, the per-node streams and the timeouts; this module
decides what ssh may do and what a node's end means.

Security of the SSH side:
- ssh runs with BatchMode (no password or passphrase prompt), StrictHostKeyChecking=yes (only keys
  already in known_hosts; a changed key ends that node as "unreachable" with ssh's words naming the
  host), no agent, X11 or port forwarding, no multiplexing master left behind. These are given on
  the command line, which wins over any ssh_config. MLENG_SSH_CONFIG (an ssh_config file, `ssh -F`)
  and MLENG_SSH_KNOWN_HOSTS (the only known_hosts file used) point it at a cluster's own files.
- Host names are parsed by ClusterShell's NodeSet after a character check (no groups, no `@`, no
  operators), counted before they are expanded, and each must be a plain host name: a name cannot
  start with `-` and become an ssh option.
- The command is an argv list, quoted once by shlex.join for the remote shell (ssh always hands the
  remote side one string); no part of it is a shell string built from input.
- A line is credited to the node whose connection it came on (ClusterShell's per-node stream), never
  to what the line says, and is cut at ssh_lines.MAX_LINE_BYTES before ClusterShell buffers it.

On the node, the argv runs under engine/remote_step.py, which kills the step's process group when
the connection closes: sshd gives a command without a terminal no signal when the client goes, so a
cancelled or timed-out step would otherwise run on.
"""

from __future__ import annotations

import collections
import os
import re
import resource
import shlex
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from .data import IMPORT_ROOT, PACKAGE

TRANSPORT_ENV = "MLENG_TRANSPORT"   # "ssh": a host list goes over SSH even where SLURM is configured
SSH_CONFIG_ENV = "MLENG_SSH_CONFIG"
SSH_KNOWN_HOSTS_ENV = "MLENG_SSH_KNOWN_HOSTS"
MAX_HOSTS = 100_000
NODESET_TEXT = re.compile(r"[A-Za-z0-9_.\-\[\],]{1,4096}")
HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]{0,251}[A-Za-z0-9])?")
ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}")   # an IPv4 or IPv6 address, as ssh -G prints a HostName
BRACKET = re.compile(r"\[([^\[\]]*)\]")
RANGE = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?")
STDERR_TAIL_CHARS = 2000
TASK_MADE = threading.Lock()
LATE_S = 5            # past the deadline, the whole step is abandoned even if ClusterShell is still closing
SSH_FAILED = 255      # ssh's own exit status when it could not connect, authenticate or verify the host

# ssh's words for "nothing listens or the host is gone", as opposed to "it answered and refused us".
NOT_ANSWERING = ("Connection refused", "Connection timed out", "No route to host", "Network is unreachable",
                 "Connection reset", "Could not resolve hostname", "Name or service not known",
                 "Temporary failure in name resolution", "Timeout, server")
HOST_KEY_WORDS = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed",
                  "No ED25519 host key is known", "host key for", "Host key for")


def _names_in(item: str) -> int:
    """How many names one node-set item ('gpu-[01-16,20]', 'a[1-2]b[1-3]') stands for, counted without
    expanding it: ClusterShell keeps a range as a set of ints, so 'n[0-99999999]' would take gigabytes."""
    total = 1
    for group in BRACKET.findall(item):
        size = 0
        for part in group.split(","):
            m = RANGE.fullmatch(part)
            if not m:
                raise ValueError(f"{item[:80]!r}: {part[:20]!r} is not a number or a range like 01-16")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"{item[:80]!r}: range {part} runs backwards")
            size += hi - lo + 1
        total *= size
    return total


def _split_items(text: str) -> list[str]:
    """'a[1-2],b,c[3,5]' -> ['a[1-2]', 'b', 'c[3,5]']: commas outside brackets separate names."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"{text[:80]!r}: brackets do not nest in a node set")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{text[:80]!r}: an unclosed '['")
    return [*items, text[start:]]


def node_set(hosts: list[str], limit: int = MAX_HOSTS) -> list[str]:
    """Plain host names from node-set text ('gpu-[01-16]', 'a,b'), sorted as ClusterShell sorts them;
    ValueError saying what is wrong with anything else."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    total = 0
    for text in hosts:
        if not NODESET_TEXT.fullmatch(text):
            raise ValueError(f"{text[:80]!r} is not a host name or node set (letters, digits, _ . -, "
                             "ranges in brackets such as gpu-[01-16]; no user@, ports, groups or spaces)")
        total += sum(_names_in(item) for item in _split_items(text))
        if total > limit:
            raise ValueError(f"the host list expands to more than {limit} names")
    try:
        names = list(NodeSet.fromlist(hosts, autostep=None))
    except NodeSetParseError as exc:
        raise ValueError(f"not a node set: {exc}") from None
    bad = [n for n in names if not HOST_NAME.fullmatch(n)]
    if bad or not names:
        raise ValueError(f"{bad[0][:80]!r} is not a plain host name" if bad else "the host list is empty")
    return names


@dataclass
class NodeEnd:
    """How one node's part of a step ended, as the transport saw it."""
    node: str
    how: str                  # exited | unreachable (ssh could not reach or trust it) | silent (still running at the deadline)
    code: int | None = None   # the command's exit status when it exited
    why: str = ""             # for unreachable: the transport's own words, naming the node
    stderr_tail: str = ""
    said: str = ""            # the launcher's words for how it exited ("Completed", "Out Of Memory"; srun only)


OnLine = Callable[[str, str], None]    # on_line(node, line): one stdout line, credited to the node it came from


class Transport(Protocol):
    """One way to reach nodes (srun: engine/srun.py SrunTransport; SSH: SshTransport below)."""

    refused: collections.Counter   # (who, why) -> lines that could not be credited to a node of the step

    def command(self, node: str, argv: list[str]) -> list[str]:
        """The local argv that runs argv on one node, its output as argv prints it (the `node=` option)."""

    def run_step(self, nodes: list[str], argv: list[str], deadline_s: float, on_line: OnLine) -> dict[str, NodeEnd]:
        """argv on every node at once; on_line(node, line) per stdout line; one NodeEnd per node. The step
        is stopped on every node before this returns."""

    def cancel(self) -> None:
        """From another thread: stop the running step on every node (its nodes end as silent)."""


def _ssh_reason(node: str, stderr: str) -> str:
    """What ssh said when it could not run the command there, in one line that names the host."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("@@@")]
    if any(word in stderr for word in HOST_KEY_WORDS):
        return (f"{node}: its host key is not the one in known_hosts (changed, or not known): ssh refused to "
                f"connect ({lines[-1][:200] if lines else 'Host key verification failed'})")
    said = next((line for line in lines if any(word in line for word in NOT_ANSWERING)), None)
    if said:
        return f"{node}: sshd not answering ({said[:200]})"
    return f"{node}: ssh could not run the command ({lines[-1][:200] if lines else 'exit status 255, no message'})"


def not_answering(end: NodeEnd) -> bool:
    """The node's sshd did not answer at all (dead or unreachable host), as opposed to refusing us."""
    return end.how == "silent" or (end.how == "unreachable" and "sshd not answering" in end.why)


class SshTransport:
    """A step over SSH: one ssh per node, all at once, through ClusterShell."""

    def __init__(self, env: dict | None = None, connect_timeout_s: int = 10):
        self.env = dict(os.environ if env is None else env)
        self.connect_timeout_s = connect_timeout_s
        self.refused: collections.Counter = collections.Counter()   # stays empty: each line comes on its node's connection
        self._task = None

    def ssh_options(self) -> list[str]:
        """Options that win over any ssh_config: first value wins in ssh, and ClusterShell puts these first."""
        opts = []
        if self.env.get(SSH_CONFIG_ENV):
            opts += ["-F", self.env[SSH_CONFIG_ENV]]
        if self.env.get(SSH_KNOWN_HOSTS_ENV):
            opts += ["-o", f"UserKnownHostsFile={self.env[SSH_KNOWN_HOSTS_ENV]}", "-o", "GlobalKnownHostsFile=/dev/null"]
        for option in ("BatchMode=yes", "StrictHostKeyChecking=yes", "PasswordAuthentication=no",
                       "KbdInteractiveAuthentication=no", "ForwardAgent=no", "ForwardX11=no",
                       "ClearAllForwardings=yes", "PermitLocalCommand=no", "UpdateHostKeys=no",
                       "ControlMaster=no", "ControlPath=none", "RequestTTY=no",
                       # a frozen host (answering TCP, not ssh) ends as silent instead of hanging the step
                       "ServerAliveInterval=5", "ServerAliveCountMax=3"):
            opts += ["-o", option]
        return ["-T", "-a", "-x", *opts]

    @staticmethod
    def capped_ssh() -> list[str]:
        """ssh run under engine/ssh_lines.py, which hands on its output with every line cut at a bound."""
        return ["env", f"PYTHONPATH={IMPORT_ROOT}", sys.executable, "-m", f"{PACKAGE}.engine.ssh_lines", "ssh"]

    def remote_command(self, node: str, argv: list[str]) -> str:
        """The one string ssh hands the remote shell: argv quoted once, under remote_step."""
        return shlex.join(["env", f"PYTHONPATH={IMPORT_ROOT}", sys.executable, "-m", f"{PACKAGE}.engine.remote_step",
                           node, "--", *argv])

    def command(self, node: str, argv: list[str]) -> list[str]:
        """The ssh argv that runs argv on one node (the `node=` option: one node, no fan-out)."""
        return ["ssh", *self.ssh_options(), "-o", f"ConnectTimeout={self.connect_timeout_s}", node,
                self.remote_command(node, argv)]

    def run_step(self, nodes: list[str], argv: list[str], deadline_s: float,
                 on_line: Callable[[str, str], None],
                 on_end: Callable[[NodeEnd], None] | None = None) -> dict[str, NodeEnd]:
        """Start argv on every node at once; on_line(node, line) for each stdout line as it comes; return
        how each node ended. Nodes still running at the deadline are cut (their ssh killed, so
        remote_step kills the command there) and end as silent. on_end(end): a node's end as soon as it
        comes (ranks of several nodes stop waiting for one whose sshd did not answer)."""
        from ClusterShell.Event import EventHandler
        from ClusterShell.Task import TimeoutError as TaskTimeout
        from ClusterShell.Task import task_self

        ends: dict[str, NodeEnd] = {}
        tails: dict[str, str] = {}

        class Handler(EventHandler):
            def ev_read(self, worker, node, sname, msg):
                text = msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)
                if sname == worker.SNAME_STDERR:
                    tails[node] = (tails.get(node, "") + text + "\n")[-STDERR_TAIL_CHARS:]
                else:
                    on_line(node, text)

            def ev_hup(self, worker, node, rc):
                ends[node] = SshTransport._classified(NodeEnd(node, "exited", rc), tails.get(node, ""))
                if on_end:
                    on_end(ends[node])

        with TASK_MADE:   # a thread's first task imports ClusterShell's worker module: two at once saw it half made
            task = self._task = task_self()   # bound to this thread; abort(kill=True) unbinds it at the end
        task.set_default("stdout_msgtree", False)   # lines go to on_line as they come, not kept twice
        task.set_default("stderr_msgtree", False)
        task.set_default("distant_workername", "ssh")   # whatever a defaults.conf on this machine says
        # every ssh under ssh_lines: ClusterShell buffers a partial line whole, so a node's endless line is cut here
        task.set_info("ssh_path", shlex.join(self.capped_ssh()))
        task.set_info("ssh_options", shlex.join(self.ssh_options()))
        task.set_info("connect_timeout", self.connect_timeout_s)
        task.set_info("fanout", self.fanout(len(nodes)))
        handler = Handler()
        for node in nodes:
            # One worker per node: the node's own name goes into its command (remote_step tells the
            # node which name it was reached by); ClusterShell still runs them all at once.
            task.shell(self.remote_command(node, argv), nodes=node, handler=handler, timeout=deadline_s,
                       stderr=True, tree=False)
        try:
            # Per-node timeouts start when a host's ssh starts; this hard limit also covers hosts that
            # waited for a fan-out slot (more hosts than the file limit lets run at once).
            task.resume(timeout=deadline_s + LATE_S)
        except TaskTimeout:
            pass   # hosts that had not ended are reported silent below
        finally:
            self._task = None
            task.abort(kill=True)
        for node in nodes:   # with the whole stderr tail: some may have come after the node's end
            end = ends.get(node) or NodeEnd(node, "silent")
            ends[node] = self._classified(end, tails.get(node, ""))
        return ends

    @staticmethod
    def _classified(end: NodeEnd, stderr_tail: str) -> NodeEnd:
        """An exited node's end, as unreachable when ssh itself failed (status 255 and ssh's complaint)."""
        end.stderr_tail = stderr_tail
        if end.how == "exited" and end.code == SSH_FAILED and SshTransport._ssh_failed(stderr_tail):
            end.how, end.code, end.why = "unreachable", None, _ssh_reason(end.node, stderr_tail)
        return end

    def address(self, node: str) -> str:
        """The address this machine's ssh reaches `node` at (its HostName in the ssh_config, `ssh -G`): what
        the other hosts dial for a rendezvous there. The name itself when ssh names no plain address."""
        import subprocess

        try:
            out = subprocess.run(["ssh", "-G", *self.ssh_options(), node], capture_output=True, text=True,
                                 timeout=10, env=self.env).stdout
        except (OSError, subprocess.TimeoutExpired):
            return node
        said = next((line.split()[1] for line in out.splitlines() if line.startswith("hostname ")
                     and len(line.split()) == 2), "")
        return said if HOST_NAME.fullmatch(said) or ADDRESS.fullmatch(said) else node

    @staticmethod
    def _ssh_failed(stderr: str) -> bool:
        """Exit 255 with ssh's own complaint (the command itself may exit 255 too)."""
        return any(word in stderr for word in (*NOT_ANSWERING, *HOST_KEY_WORDS, "Permission denied", "ssh:"))

    @staticmethod
    def fanout(count: int) -> int:
        """Every node at once, within this process's file limit (an ssh holds 3 pipes here, 6 descriptors
        counting both ends while it starts): the soft limit is raised toward the hard one when needed."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 64 + 8 * count
        if soft != resource.RLIM_INFINITY and soft < wanted:
            soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        return max(1, min(count, (soft - 64) // 8))

    def cancel(self) -> None:
        """Stop the step on every node (from another thread): each ssh is killed, remote_step on the node
        sees its connection close and kills the command's process group."""
        task = self._task
        if task is not None:
            task.abort()
