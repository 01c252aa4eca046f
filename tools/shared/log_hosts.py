"""Which host a log line came from, and what names a GPU or a host beyond one line: the driver's GPU serials and
NCCL's address of each host. Used by log triage to name a culprit (shared/culprit_kind.py). Every pattern here is
bounded (tests/test_reliability.py holds it linear on lines of logscan.MAX_MATCH_CHARS)."""

import re
from pathlib import Path

from .logscan import rank_of_path

# Which host printed a line: a syslog / journal prefix ("Dec  2 11:38:47 worker4 kernel: ...", ISO journal
# "2024-12-02T11:38:47+0000 worker4 kernel:"), or NCCL's "host:pid:tid [dev]" prefix (after a rank label).
_HOST_SYSLOG = re.compile(r"^[ \t]*(?:[A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}|\d{4}-\d{2}-\d{2}T[\d:.,+-]{8,32})"
                          r" ([A-Za-z0-9][\w.-]{0,63}) (?:kernel|[\w.-]{1,64}\[\d+\]):")
_HOST_NCCL = re.compile(r"^[ \t]*(?:\[(?:rank|default)\d+\]:|\d{1,6}: )?[ \t]*([A-Za-z0-9.][\w.-]{0,63}):\d+:\d+ \[\d+\] ")
# A host name in a file name: "syslog-gpu-node02.log", "kern.node3.log", "dmesg_worker4.txt".
_HOST_FILE = re.compile(r"^(?:syslog|kern|kernel|dmesg|journal|messages|nccl|job|train)?[._-]?"
                        r"([a-z][a-z0-9-]{0,62}\d)(?:\.[a-z]+)*$", re.IGNORECASE)
_NOT_HOSTS = {"log", "rank", "stderr", "stdout", "slurm", "out", "err"}


def line_host(line: str) -> str | None:
    """The host a line says it came from (syslog / journal prefix, NCCL prefix), or None."""
    head = line[:200]
    m = _HOST_SYSLOG.match(head) or _HOST_NCCL.match(head)
    return m.group(1) if m else None


def host_of_path(path: str) -> str | None:
    """A host name in a kernel-log file's name ('syslog-gpu-node02.log' -> 'gpu-node02'); None for rank files."""
    name = Path(path).name
    m = _HOST_FILE.match(name)
    if not m or rank_of_path(name) is not None or re.match(r"(?:slurm|rank)[-_]?\d", m.group(1), re.IGNORECASE):
        return None
    host = m.group(1)
    return None if host.lower() in _NOT_HOSTS or host.isdigit() else host


# The driver names each GPU once per boot: "NVRM: GPU at PCI:0000:00:08: GPU-c248..." then "NVRM: GPU Board Serial
# Number: 1652923018111". NCCL names each host's address: "host:pid:tid [d] NCCL INFO Bootstrap : Using bond0:10.1.2.3<0>".
_GPU_IDENTITY = re.compile(r"NVRM: GPU at PCI:([0-9a-fA-F:.]{5,16}): (GPU-[0-9a-fA-F-]{8,40})"
                           r"(?:[^\n]{0,120}\n[^\n]{0,160}?GPU Board Serial Number: (\w{1,32}))?")
_NCCL_ADDRESS = re.compile(r"^[ \t]*(?:\[(?:rank|default)\d+\]:|\d{1,6}: )?[ \t]*([A-Za-z0-9][\w.-]{0,63}):\d+:\d+ \[\d+\] "
                           r"NCCL INFO [^\n]{0,120}?Using [^\n]{0,160}?(\d{1,3}(?:\.\d{1,3}){3})<", re.MULTILINE)


def gpu_identities(block: str) -> dict[str, tuple[str, str]]:
    """PCI bus id as the driver prints it -> (GPU UUID, board serial or '') from the driver's boot lines."""
    if "GPU at PCI:" not in block:
        return {}
    return {m.group(1).lower(): (m.group(2), m.group(3) or "") for m in _GPU_IDENTITY.finditer(block)}


def host_addresses(block: str) -> dict[str, str]:
    """IPv4 address -> the host NCCL said it uses it on (bootstrap / NET lines)."""
    if " : Using " not in block:      # NCCL says each address once, at init: most blocks have none
        return {}
    return {m.group(2): m.group(1) for m in _NCCL_ADDRESS.finditer(block)}


# Which GPU a rank drives, as the rank itself said it: PyTorch's "[PG ID 0 PG GUID 0 Rank 7]  using GPU 7 to perform
# barrier" and NCCL's init line "host:pid:tid [7] NCCL INFO comm 0x.. rank 7 nranks 8 cudaDev 7 nvmlDev 7 busId b7000".
# Only the default group (PG ID 0) and the largest NCCL communicator number ranks globally; a subgroup's "Rank 0" is
# another process.
_TORCH_RANK_GPU = re.compile(r"\[PG ID 0 PG GUID [\w()]{1,40} Rank (\d{1,7})\] {1,4}using GPU (\d{1,3}) ")
_NCCL_RANK_GPU = re.compile(r"^[ \t]*(?:\[(?:rank|default)\d+\]:|\d{1,6}: )?[ \t]*([A-Za-z0-9][\w.-]{0,63}):\d+:\d+ \[\d+\] "
                            r"NCCL INFO (?:ncclCommInitRank\w{0,12} )?comm 0x[0-9a-f]{1,16} rank (\d{1,7}) nRanks (\d{1,7})[^\n]{0,80}? cudaDev (\d{1,3})"
                            r"(?: nvmlDev \d{1,3})? busId ([0-9a-fA-F]{1,16})", re.MULTILINE | re.IGNORECASE)


def rank_devices(block: str) -> dict[int, tuple[str, str, str]]:
    """rank -> (host or '', CUDA device index, PCI bus id or '') from the ranks' own start-up lines."""
    found: dict[int, tuple[str, str, str]] = {}
    if "using GPU " in block:
        for m in _TORCH_RANK_GPU.finditer(block):
            found[int(m.group(1))] = ("", m.group(2), "")
    if "cudaDev " in block:
        matches = list(_NCCL_RANK_GPU.finditer(block))
        world = max((int(m.group(3)) for m in matches), default=0)
        for m in matches:
            if int(m.group(3)) == world:       # the largest communicator's ranks are the job's global ranks
                found[int(m.group(2))] = (m.group(1), m.group(4), m.group(5).lower())
    return found


def device_phrase(devices: dict[int, tuple[str, str, str]], rank: int, host_said: bool = False) -> str:
    """' (GPU 7 on node3, bus b7000)' for a rank whose device the log names, else ''; without the host when the
    sentence names it already (`host_said`)."""
    if rank not in devices:
        return ""
    host, index, bus = devices[rank]
    host = "" if host_said else host
    return f" (GPU {index}" + (f" on {host}" if host else "") + (f", bus {bus}" if bus else "") + ")"
