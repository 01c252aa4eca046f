"""$MLENG_HOME: the one door for every file and folder mleng creates under it.

The home holds results with log evidence, the HTTP token, GPU locks, cached tool lists and drill state.
On a shared host another user may have made the folder first (a predictable /tmp path), or planted a
file or a symbolic link in it, hoping we write a secret into their file or create, chmod or delete
something through their link (security review 2026-12-02, R1). So:
- the home and every folder under it must be owned by the effective user; one that is not is refused
  (UnsafeHome: the path, its owner and the fix), never used. Ours are tightened to 0700 through their
  descriptor, so no chmod ever follows a link; a symbolic link inside the home is refused;
- folders under the home are walked by descriptor (mkdir/open relative to the parent's fd);
- a file we create is 0600 and new: `write_private` writes a temporary file opened with
  O_CREAT|O_EXCL|O_NOFOLLOW and renames it into place, so bytes never go into a file someone else made;
- a file we open again (a lock, the database) is opened with O_NOFOLLOW and checked on its descriptor:
  regular and ours, or refused.
Once every folder from the home down is ours and writable by nobody else, no other user can add, rename
or remove a name inside it, so a path checked here stays ours for the callers that use it by name.
`tests/test_door_home.py` fails when code under tools/ creates files under the home another way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from .spec import ToolFailure

DIR_MODE = 0o700
FILE_MODE = 0o600
FIX = "remove it, or set MLENG_HOME to a folder you own"


class UnsafeHome(ToolFailure, PermissionError):
    """A folder or file under $MLENG_HOME that is not the current user's alone: refused, never used.

    A ToolFailure, so a run ends with this message as is; a PermissionError, so every "cannot write the
    home" path that catches OSError reports it too."""

    def __str__(self) -> str:      # the message alone, as a ToolFailure reads (not "[Errno 1] ...")
        return self.strerror or super().__str__()


def mleng_home() -> Path:
    """$MLENG_HOME, else the XDG data directory (~/.local/share/mleng)."""
    if os.environ.get("MLENG_HOME"):
        return Path(os.environ["MLENG_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "mleng"


def refusal(path: Path | str, info: os.stat_result, why: str) -> UnsafeHome:
    """The error for `path`, which is `why` (e.g. "owned by another user")."""
    return UnsafeHome(errno.EPERM, f"{path} is {why} (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}; "
                      f"this process runs as uid {os.geteuid()}). mleng keeps results, tokens and locks only where "
                      f"no other user can write: {FIX}.")


def _check_owned(fd: int, path: Path, mode: int, kind=stat.S_ISDIR) -> os.stat_result:
    """The descriptor's stat after checking it is a `kind` we own; tightened to `mode` through the fd."""
    info = os.fstat(fd)
    if not kind(info.st_mode):
        raise refusal(path, info, "not a folder" if kind is stat.S_ISDIR else "not a regular file")
    if info.st_uid != os.geteuid():
        raise refusal(path, info, "owned by another user")
    if kind is stat.S_ISREG and info.st_nlink != 1:    # a name planted for one of our files elsewhere
        raise refusal(path, info, f"a file with {info.st_nlink} names (a hard link)")
    if stat.S_IMODE(info.st_mode) != mode:
        os.fchmod(fd, mode)
    return info


def _open_nofollow(name: str | Path, path: Path, flags: int, dir_fd: int | None = None, mode: int = FILE_MODE) -> int:
    """os.open with O_NOFOLLOW; a symbolic link at the name is UnsafeHome, not ELOOP."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            info = os.lstat(name, dir_fd=dir_fd)
            if stat.S_ISLNK(info.st_mode):
                raise refusal(path, info, "a symbolic link") from None
        raise


def _open_home() -> tuple[int, Path]:
    """A descriptor on the home, created 0700 if missing, after checking it and the folder it sits in."""
    home = mleng_home()
    home.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)   # parents (~/.local/share) keep the umask's mode
    parent = os.stat(home.parent)     # whoever may rename entries there may swap the home for their own
    if not parent.st_mode & stat.S_ISVTX and (parent.st_mode & stat.S_IWOTH or parent.st_uid not in (os.geteuid(), 0)):
        raise refusal(home.parent, parent, "the home's folder, and another user may replace the home in it "
                      "(writable by every user, or another user's, and not sticky as /tmp is)")
    link = os.lstat(home)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
        raise refusal(home, link, "a symbolic link made by another user")
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)    # a link of ours (or root's) is followed
    try:
        _check_owned(fd, home, DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd, home


def _one_name(part: str) -> str:
    if not part or part in (".", "..") or "/" in part or "\0" in part:
        raise ValueError(f"{part!r} is not a folder name under $MLENG_HOME")
    return part


@contextlib.contextmanager
def _folder_fd(*parts: str):
    """A descriptor on $MLENG_HOME/parts..., every folder created 0700 and checked, walked by descriptor."""
    fd, path = _open_home()
    try:
        for part in parts:
            path = path / _one_name(part)
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, DIR_MODE, dir_fd=fd)
            child = _open_nofollow(part, path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
            _check_owned(fd, path, DIR_MODE)
        yield fd, path
    finally:
        os.close(fd)


def private_dir(*parts: str) -> Path:
    """$MLENG_HOME (or a folder under it), created 0700; an existing one of ours is tightened to 0700,
    one another user owns (or a link) is UnsafeHome.

    Everything under it (results with log evidence and params, tokens, plots, dumps) is the owner's
    only: on a shared login node the process umask (usually 022) would make it world-readable."""
    with _folder_fd(*parts) as (_, path):
        return path


def private_file(path: Path, create: bool = True) -> Path:
    """`path` (in a folder private_dir gave) as a regular file of ours with mode 0600: created empty
    if missing (so a library that opens it later inherits the mode: SQLite gives its -wal and -shm files
    the database's mode), an existing one tightened. create=False: tighten it only if it exists."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = _open_nofollow(path, path, flags)
    except FileNotFoundError:
        if create:
            raise
        return path
    try:
        _check_owned(fd, path, FILE_MODE, stat.S_ISREG)
    finally:
        os.close(fd)
    return path


def _check_folder(folder: Path) -> None:
    """`folder` is one of ours that no one else can write (as private_dir leaves it)."""
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise refusal(folder, info, "not a folder (a symbolic link or a file)")
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise refusal(folder, info, "not a private folder of this user")


FileIdentity = tuple[int, int]     # (st_dev, st_ino): the file we wrote, to remove that one only


def write_private(path: Path, data: bytes | str, mode: int = FILE_MODE) -> FileIdentity:
    """Write `data` to a new file and rename it to `path` (in a private folder): never into an existing
    file, never through a link; readers see the old or the new content, never half. Returns the new file's
    identity (remove_private removes only that file)."""
    if mode & 0o077:
        raise ValueError(f"mode {mode:o}: files under $MLENG_HOME are the owner's only")
    _check_folder(path.parent)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data.encode() if isinstance(data, str) else data)
        info = os.fstat(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return info.st_dev, info.st_ino


def remove_private(path: Path, identity: FileIdentity) -> bool:
    """Remove `path` only if it is still the file write_private returned `identity` for; True if removed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if (info.st_dev, info.st_ino) != identity:
        return False
    os.unlink(path)
    return True


def read_private(path: Path, limit_bytes: int) -> bytes | None:
    """The content of a file we wrote (regular, ours, 0600), or None when it does not exist; UnsafeHome
    for a link, another user's file or one others may read or write; OSError past limit_bytes."""
    try:
        fd = _open_nofollow(path, path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise refusal(path, info, "not a private file of this user")
        data = f.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise OSError(errno.EFBIG, f"{path} is larger than {limit_bytes} bytes; it is not one mleng wrote")
    return data


def open_lock(path: Path) -> int:
    """A descriptor for flock on `path` (in a private folder), created 0600 if missing; a link or a file
    of another user is UnsafeHome (open(..., "a+") followed a planted link and created its target as us)."""
    fd = _open_nofollow(path, path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
    try:
        _check_owned(fd, path, FILE_MODE, stat.S_ISREG)
    except BaseException:
        os.close(fd)
        raise
    return fd
