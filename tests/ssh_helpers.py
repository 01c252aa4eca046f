"""An sshd of our own on 127.0.0.1 for the SSH transport's tests: keys made per test session in a
private folder, known_hosts and ssh_config written here, every host name an alias of one sshd.

    with local_sshd(["n1", "n2"]) as ssh:   # ssh.config: the file for MLENG_SSH_CONFIG
        ...

The multi-node tests use one sshd per namespace node instead (scripts/cluster-local.sh sshd).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def _have_openssh() -> bool:
    return Path(SSHD).is_file() and bool(shutil.which("ssh")) and bool(shutil.which("ssh-keygen"))


def why_no_sshd() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "the local sshd runs as root (it logs in as root with a key made for the test)"
    if not _have_openssh() and shutil.which("apt-get"):
        # As scripts/cluster-local.sh does for its nodes: a fresh CI machine has no sshd, and these tests
        # would skip there (or pass only after a cluster test happened to install it first). One apt at a
        # time: two pytest workers may ask at once.
        subprocess.run(["flock", "-w", "600", "/run/lock/mleng-apt.lock", "sh", "-c",
                        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                        "--no-install-recommends openssh-server openssh-client"],
                       capture_output=True, timeout=700)
    if not _have_openssh():
        return "needs openssh-server and openssh-client (apt-get install -y openssh-server)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@dataclass
class LocalSshd:
    folder: Path
    port: int
    config: Path
    known_hosts: Path
    alias: str


def host_entry(name: str, folder: Path, port: int, alias: str) -> str:
    return (f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  HostKeyAlias {alias}\n  User root\n"
            f"  IdentityFile {folder}/client\n  IdentitiesOnly yes\n  UserKnownHostsFile {folder}/known_hosts\n")


@contextlib.contextmanager
def local_sshd(names: list[str], dead: list[str] = ()):
    """One sshd on 127.0.0.1:<free port> answering for every name in `names`; `dead` names point at a
    port nothing listens on. Everything is removed on exit."""
    folder = Path(tempfile.mkdtemp(prefix="mleng-sshd-"))
    proc = None
    try:
        folder.chmod(0o700)
        host_key = keygen(folder / "host", "test-host")
        keygen(folder / "client", "test-client")
        (folder / "authorized_keys").write_text((folder / "client.pub").read_text())
        port, alias = free_port(), "mleng-test-nodes"
        (folder / "known_hosts").write_text(f"{alias} {host_key}\n")
        (folder / "sshd.conf").write_text(
            f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {folder}/host\nPidFile {folder}/sshd.pid\n"
            f"AuthorizedKeysFile {folder}/authorized_keys\nStrictModes no\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nAllowAgentForwarding no\n"
            "AllowTcpForwarding no\nX11Forwarding no\nMaxStartups 200\n")
        config = "".join(host_entry(n, folder, port, alias) for n in names)
        config += "".join(host_entry(n, folder, free_port(), alias) for n in dead)
        (folder / "config").write_text(config)
        Path("/run/sshd").mkdir(exist_ok=True)   # sshd's privilege-separation folder
        # its own session: the per-connection sshd children go with the listener at the end (one re-exec'd after
        # the folder was emptied logged "Unable to load host key" into it and left it behind)
        proc = subprocess.Popen([SSHD, "-D", "-f", str(folder / "sshd.conf"), "-E", str(folder / "log")],
                                start_new_session=True)
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.05)
        yield LocalSshd(folder, port, folder / "config", folder / "known_hosts", alias)
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)     # a connection's child that outlived the listener
        shutil.rmtree(folder, ignore_errors=True)
