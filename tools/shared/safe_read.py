"""Reading a file someone else wrote: the one way every tool opens a log, a dump or a saved output.

A path in tool arguments may come from a prompt-injected agent, and a file on a shared disk from anyone.
So, where a file is expected:
- only a regular file is read. A FIFO nobody writes would hold a run slot until the deadline, and a
  device such as /dev/zero or /dev/urandom never ends: both, sockets and directories are refused with
  an error naming the path, what it is and what is accepted;
- a kernel pseudo-file (anything on proc, sysfs, tracefs, debugfs ...) is refused although it says it is a regular
  file: /proc/kmsg and /sys/kernel/tracing/trace_pipe block until the kernel writes, and reading kmsg as root
  takes those lines from journald. The filesystem is that of the descriptor (its st_dev in /proc/self/mountinfo),
  so neither a link nor a bind mount of /proc elsewhere gets through;
- the open itself never blocks (O_NONBLOCK: opening a FIFO without a writer waits forever otherwise),
  and the type is checked on the descriptor we read, so a file swapped for a FIFO after a check is
  still refused;
- whole-file reads are bounded (`read_head`, `read_tail`, `read_limited`): memory stays at the limit
  whatever the file holds. Streaming readers (logscan) take the descriptor from `open_regular` and keep
  their own bounded buffers.
The errors are OSError subclasses, so every reader's existing "cannot read" path reports them.
"""

import errno
import fcntl
import os
import stat
from functools import lru_cache
from typing import BinaryIO

MiB = 1 << 20


class NotRegularFile(OSError):
    """The path names something other than a regular file (FIFO, device, socket, directory)."""


# Filesystems whose "regular files" are the kernel's own interfaces, not data someone wrote.
KERNEL_FILESYSTEMS = frozenset({"proc", "sysfs", "tracefs", "debugfs", "securityfs", "configfs", "cgroup", "cgroup2",
                                "bpf", "pstore", "efivarfs", "fusectl", "binfmt_misc", "rpc_pipefs", "nsfs"})


class FileTooLarge(OSError):
    """A whole-file read found more bytes than its stated limit."""


def kind_of(mode: int) -> str:
    """What a stat mode is, in words for an error message."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return kind
    return "not a regular file"


def open_regular(path: str | os.PathLike, field: str = "path") -> BinaryIO:
    """The file open for binary reading; NotRegularFile unless it is a regular file (symlinks to one are
    followed: reading through a link exposes nothing the link's target does not)."""
    # The file is looked at before it is opened for reading: opening a device runs its driver (closing
    # /dev/watchdog without its magic byte reboots the node). An O_PATH descriptor opens nothing; the read
    # descriptor is then made from it, so the file checked is the file read.
    handle = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        st = os.fstat(handle)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{kind_of(st.st_mode)}, not a regular file ({field} reads regular "
                                 "files only: FIFOs, devices, sockets and directories are refused)", str(path))
        if fs := kernel_filesystem(st.st_dev) or filesystem_magic(handle):
            raise NotRegularFile(errno.EINVAL, f"a kernel {fs} file{_real_path(handle, path)}, not a file someone "
                                 f"wrote ({field} refuses /proc, /sys and other kernel pseudo-files: some, such as "
                                 "/proc/kmsg and trace_pipe, never end)", str(path))
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(handle)
    try:
        if os.fstat(fd).st_ino != st.st_ino:     # cannot happen through the descriptor; say so if it does
            raise NotRegularFile(errno.EINVAL, "the file changed while it was opened", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# statfs(2) f_type of the kernel pseudo-filesystems (linux/magic.h): the type of the filesystem a descriptor is
# on, whoever mounted it. /proc/self/mountinfo lists only our own mount namespace's mounts: a procfs another
# user mounted in a namespace of theirs, reached through /proc/<pid>/root, is not there.
KERNEL_MAGIC = {0x9FA0: "proc", 0x62656572: "sysfs", 0x74726163: "tracefs", 0x64626720: "debugfs",
                0x73636673: "securityfs", 0x62656570: "configfs", 0x27E0EB: "cgroup", 0x63677270: "cgroup2",
                0xCAFE4A11: "bpf", 0x6165676C: "pstore", 0xDE5E81E4: "efivarfs", 0x65735543: "fusectl",
                0x42494E4D: "binfmt_misc", 0x67596969: "rpc_pipefs", 0x6E736673: "nsfs"}


def filesystem_magic(fd: int) -> str | None:
    """The kernel pseudo-filesystem a descriptor is on, by fstatfs's f_type; None for any other (or no libc)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)        # struct statfs; f_type is its first field (a long)
        if libc.fstatfs(fd, buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return KERNEL_MAGIC.get(ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF)


@lru_cache(maxsize=64)
def kernel_filesystem(device: int) -> str | None:
    """The kernel pseudo-filesystem type mounted with this st_dev (see KERNEL_FILESYSTEMS), else None."""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:   # the kernel's, about us
            for line in f:    # "36 35 0:21 / /proc rw,relatime - proc proc rw": device 3rd, type after " - "
                mount, _, source = line.partition(" - ")
                fields, fs = mount.split(), (source.split() or [""])[0]
                if len(fields) > 2 and fields[2] == wanted and fs in KERNEL_FILESYSTEMS:
                    return fs
    except OSError:       # no /proc (not Linux): nothing is known to be a kernel file
        return None
    return None


def _real_path(fd: int, given) -> str:
    """' (<real path>)' when the descriptor's path differs from the one given (a link), else ''."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
    return f" ({real})" if real != os.path.abspath(given) else ""


def read_head(path: str | os.PathLike, limit_bytes: int, field: str = "path") -> bytes:
    """At most the first limit_bytes of a regular file."""
    with open_regular(path, field) as f:
        return f.read(limit_bytes)


def read_tail(path: str | os.PathLike, limit_bytes: int, field: str = "path") -> bytes:
    """At most the last limit_bytes of a regular file (the end of a log says how it ended)."""
    with open_regular(path, field) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - limit_bytes))
        return f.read(limit_bytes)


def read_limited(path: str | os.PathLike, limit_bytes: int, field: str = "path") -> bytes:
    """The whole regular file; FileTooLarge when it holds more than limit_bytes (a cut JSON document
    would only fail later, less clearly)."""
    with open_regular(path, field) as f:
        data = f.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise FileTooLarge(errno.EFBIG, f"larger than the {limit_bytes / MiB:g} MiB {field} reads", str(path))
    return data


def owner_problem(st: os.stat_result, owners: set[int], whose: str) -> str:
    """Why a file found at a DEFAULT location (torch's /tmp prefix, a rank's dump path) is not evidence: ""
    when one of `owners` or root owns it. Anyone can write into /tmp: a file another user planted there must
    not name a culprit. A path the caller gave is theirs to vouch for and is not checked."""
    if st.st_uid in owners or st.st_uid == 0:
        return ""
    return f"owned by uid {st.st_uid}, not {whose} (uid {', '.join(map(str, sorted(owners)))}): not used"
