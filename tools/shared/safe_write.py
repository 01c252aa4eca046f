"""Writing a file a caller named, safely: the one way every tool writes a user-named file.

A path in tool arguments may come from a prompt-injected agent. So:
- no path: the file goes under $MLENG_HOME (`default_dir`), created as needed, 0700;
- a file we create is 0600 (the owner reads it; a shared login node's other users do not);
- a relative path is resolved against the caller's working directory (children inherit it);
- a symlink, a FIFO, a device, a directory or a socket at the path is refused (a FIFO would block
  the run, a device such as /dev/full fails in odd ways, a symlink points the write elsewhere);
- an existing file is never replaced unless `overwrite` is set;
- a missing directory, a full disk or a permission problem is a ToolFailure saying so, not a traceback.
The final open uses O_NOFOLLOW (and O_EXCL when not overwriting), so a link planted between the check
and the write is refused too.
"""

import contextlib
import errno
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..engine import attachments
from ..engine.spec import ToolFailure
from ..engine.home import private_dir


def unique_name(stem: str, suffix: str = ".png") -> str:
    """A default file name no other run picks: the second, the pid and 24 random bits (two sweeps ending in
    the same second once shared one PNG, and each answer showed the other's plot)."""
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}{suffix}"


def output_path(path: str | None, default_dir: str, default_name: str) -> Path:
    """Where a write goes: `path` (~ expanded, relative to the working directory), else
    $MLENG_HOME/<default_dir>/<default_name> (the directory is created)."""
    if not path:
        return private_dir(default_dir) / default_name
    target = Path(path).expanduser()
    return target if target.is_absolute() else Path.cwd() / target


def _refuse_existing(target: Path, overwrite: bool, field: str) -> None:
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise ToolFailure(f"{field}: {target} is a symbolic link; refusing to write through it. Give the real path.")
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else
                "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a regular file")
        raise ToolFailure(f"{field}: {target} is {kind}; give the path of a regular file to write.")
    if not overwrite:
        raise ToolFailure(f"{field}: {target} already exists; choose another path, or pass overwrite=true to "
                          "replace it.")


def check_output(target: Path, *, overwrite: bool = False, field: str = "path") -> Path:
    """The checks open_output makes, without writing: call it before a long run, so a bad path fails
    in a millisecond, not after the work."""
    _refuse_existing(target, overwrite, field)
    if not target.parent.is_dir():
        raise ToolFailure(f"{field}: the directory {target.parent} does not exist; create it first or choose "
                          "another path.")
    return target


@contextlib.contextmanager
def open_output(target: Path, *, overwrite: bool = False, field: str = "path") -> Iterator[BinaryIO]:
    """A binary file object for writing `target`, after the checks above; every OS error becomes a
    ToolFailure naming `field` and the path."""
    check_output(target, overwrite=overwrite, field=field)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(target, flags, 0o600)   # plots and dumps carry hosts and stacks: the owner's only
    except OSError as e:
        raise ToolFailure(_os_message(field, target, e)) from None
    written = False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):     # swapped for something else since the check
            raise ToolFailure(f"{field}: {target} is not a regular file; refusing to write to it.")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb", closefd=False) as f:
            yield f
        attachments.keep(target, fd)    # an answer attaching this file reads it from here, not by name
        written = True
    except OSError as e:
        raise ToolFailure(_os_message(field, target, e)) from None
    finally:
        os.close(fd)
        if not written and not overwrite:
            with contextlib.suppress(OSError):
                os.unlink(target)      # ours, half written: leave nothing behind


def _os_message(field: str, target: Path, e: OSError) -> str:
    why = {errno.EEXIST: "it appeared while writing (pass overwrite=true to replace it)",
           errno.ELOOP: "it is a symbolic link", errno.ENOSPC: "no space left on the device",
           errno.EACCES: "permission denied", errno.EROFS: "the filesystem is read-only",
           errno.ENXIO: "it is a FIFO with no reader"}.get(e.errno, e.strerror or str(e))
    return f"{field}: could not write {target}: {why}."


def write_output(target: Path, data: str | bytes, *, overwrite: bool = False, field: str = "path") -> Path:
    """Write `data` (text is UTF-8) to `target` with open_output's checks; returns the path written."""
    with open_output(target, overwrite=overwrite, field=field) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return target


def write_figure(fig, target: Path, *, overwrite: bool = False, field: str = "plot_path") -> str:
    """Save a matplotlib figure as PNG through open_output (never `savefig(path)`, which follows links and
    replaces files); returns the path written. The figure is closed either way."""
    import matplotlib.pyplot as plt

    try:
        with open_output(target, overwrite=overwrite, field=field) as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return str(target)
