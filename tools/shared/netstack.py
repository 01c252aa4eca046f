"""What a node's network stack is made of: the pieces that differ between nodes and break NCCL across them.

The NCCL net plugin NCCL would load, the rdma-core / MLNX_OFED version, RDMA firmware, the kernel, the GPU
VBIOS and the container image. env_report records them and fleet_sweep compares them across nodes (drift):
in NCCL #1634 a plugin present on some hosts only made every mixed pair hang.

Plugin search (NCCL user guide, NCCL_NET_PLUGIN, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
read 2026-12-01): NCCL_NET_PLUGIN=none loads no plugin; set to a name, NCCL tries that library name, then
libnccl-net-<name>.so; unset, libnccl-net.so. Each name is found by the dynamic loader: LD_LIBRARY_PATH, the
ld.so cache, then the default directories (ld.so(8)). Nothing here loads a library: files are only found.
"""

from __future__ import annotations

import glob
import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path

from . import topology
from .safe_read import MiB, open_regular, read_head

DEFAULT_LIB_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                    "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
LDCONFIG_TIMEOUT_S = 10
# A plugin is a few MiB; the hash covers at most this much of a file found on a path others may write to.
PLUGIN_HASH_LIMIT = 256 * MiB


def plugin_candidates(env: dict[str, str]) -> list[str]:
    """The library names NCCL tries, in order ([] when NCCL_NET_PLUGIN=none)."""
    value = env.get("NCCL_NET_PLUGIN", "").strip()
    if value.lower() == "none":
        return []
    if not value:
        return ["libnccl-net.so"]
    return [value, f"libnccl-net-{value}.so"]


def ld_cache() -> dict[str, str]:
    """{library name: path} from the ld.so cache (`ldconfig -p`); {} where ldconfig is missing."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=LDCONFIG_TIMEOUT_S).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        found: dict[str, str] = {}
        for m in re.finditer(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", out, re.M):
            found.setdefault(m.group(1), m.group(3))
        return found
    return {}


def find_library(name: str, env: dict[str, str], cache: dict[str, str]) -> str | None:
    """Where the dynamic loader would find `name` (a path with a slash is taken as is)."""
    if "/" in name:
        return name if os.path.isfile(name) else None
    for folder in [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    if name in cache and os.path.isfile(cache[name]):
        return cache[name]
    return next((os.path.join(d, name) for d in DEFAULT_LIB_DIRS if os.path.isfile(os.path.join(d, name))), None)


def _digest(path: str) -> str:
    """sha256 prefix of the file (its first PLUGIN_HASH_LIMIT bytes); a FIFO or device is refused, not read."""
    h, left = hashlib.sha256(), PLUGIN_HASH_LIMIT
    with open_regular(path, "nccl_net_plugin") as f:
        while left > 0 and (block := f.read(min(MiB, left))):
            h.update(block)
            left -= len(block)
    return h.hexdigest()[:12]


def net_plugin(env: dict[str, str], cache: dict[str, str] | None = None) -> str:
    """'<path> (sha256 <12 hex>)' of the plugin NCCL would load, or why none would be."""
    names = plugin_candidates(env)
    if not names:
        return "none (NCCL_NET_PLUGIN=none)"
    cache = ld_cache() if cache is None else cache
    for name in names:
        path = find_library(name, env, cache)
        if path:
            try:
                return f"{os.path.realpath(path)} (sha256 {_digest(path)})"
            except OSError as e:
                return f"{path} (unreadable: {e.strerror})"
    return f"none found ({' / '.join(names)}): NCCL's internal IB and socket transports"


def rdma_core(cache: dict[str, str] | None = None) -> str | None:
    """MLNX_OFED's version where `ofed_info` exists, else libibverbs' file name: rdma-core builds it as
    libibverbs.so.1.<abi>.<rdma-core version> (libibverbs.so.1.14.50.0 is rdma-core 50.0)."""
    try:
        out = subprocess.run(["ofed_info", "-s"], capture_output=True, text=True, timeout=LDCONFIG_TIMEOUT_S).stdout
        if out.strip():
            return out.strip().rstrip(":")
    except (OSError, subprocess.TimeoutExpired):
        pass
    cache = ld_cache() if cache is None else cache
    path = cache.get("libibverbs.so.1")
    if not path:
        return None
    real = os.path.basename(os.path.realpath(path))
    m = re.match(r"libibverbs\.so\.1\.\d+\.(\d+(?:\.\d+)*)$", real)
    return f"rdma-core {m.group(1)} ({real})" if m else real


def nic_firmware() -> dict[str, str]:
    """{RDMA device: firmware version} from sysfs fw_ver."""
    root = topology.SYSFS / "class" / "infiniband"
    out = {}
    for dev in sorted(glob.glob(str(root / "*"))):
        fw = topology.read_attr(root / os.path.basename(dev) / "fw_ver")
        if fw:
            out[os.path.basename(dev)] = fw
    return out


def container() -> str | None:
    """The container this runs in and its image where the runtime says it: podman writes /run/.containerenv
    (image=, imageid=), docker leaves /.dockerenv (no image id inside). Other runtimes: None (not detected)."""
    try:
        text = read_head(Path("/run/.containerenv"), 64 * 1024, "container").decode(errors="replace")
    except OSError:
        text = None
    if text is not None:
        fields = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', text, re.M))
        return f"podman image {fields.get('image', '?')} id {fields.get('imageid', '?')[:12]}"
    if os.path.exists("/.dockerenv"):
        return "docker (the image id is not visible inside the container)"
    return None


def vbios(pynvml) -> str | None:
    """The GPU VBIOS versions (sorted, de-duplicated), through an initialised NVML."""
    try:
        versions = {pynvml.nvmlDeviceGetVbiosVersion(pynvml.nvmlDeviceGetHandleByIndex(i))
                    for i in range(pynvml.nvmlDeviceGetCount())}
    except Exception:
        return None
    return ", ".join(sorted(v.decode() if isinstance(v, bytes) else v for v in versions)) or None


def kernel() -> str:
    return platform.release()
