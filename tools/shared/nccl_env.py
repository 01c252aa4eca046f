"""NCCL settings for one distributed run: `nccl_env={"NCCL_ALGO": "Ring", "NCCL_IB_GID_INDEX": "3"}`.

Users tune NCCL through its environment variables (NVIDIA's "Environment Variables" page of the NCCL
user guide). A run of dist_smoke_test or collective_bench may set the ones below for its own ranks
only: each rank applies them before its process group is created (shared/ranks.py), so every launch
path (torchrun here, one torchrun per node through srun, nodes started by hand, pairwise groups) gets
them, and the result echoes what was set.

The allow-list is a trust boundary: a caller's value is one token of NCCL's own syntax (names,
numbers, `^=` prefixes, comma lists), never a path. Variables that load code or read or write files
(NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_TOPO_FILE, NCCL_GRAPH_FILE, NCCL_DEBUG_FILE, NCCL_CONF_FILE)
are refused: a prompt-injected agent could point them anywhere.
"""

import functools
import re

from ..engine.spec import Field

NCCL_SETTABLE = frozenset({
    # algorithms, protocols, channels, buffers
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE",
    "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE", "NCCL_CUMEM_ENABLE",
    # transports inside a node
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE",
    # network
    "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_IB_SL",
    "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD",
    "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_CROSS_NIC", "NCCL_PXN_DISABLE",
    # logging (to the ranks' output, which the tools read)
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
})
VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:^=+\-]{1,128}$")
MAX_SETTINGS = 16


def nccl_env_field():
    return Field(default_factory=dict, max_length=MAX_SETTINGS, description=(
        # the allow-list is not repeated here (~0.5 K characters in two tools' schemas): a refusal lists it
        "NCCL_* settings for this run, e.g. {'NCCL_ALGO': 'Ring'}; allow-listed (a refusal lists them)."))


def check_nccl_env(settings: dict[str, str]) -> dict[str, str]:
    """`settings` if every name is allowed and every value is one token; ValueError naming the first bad one."""
    for name, value in settings.items():
        if name not in NCCL_SETTABLE:
            hint = " (it loads code or touches files)" if name.startswith("NCCL_") else ""
            raise ValueError(f"nccl_env: {name[:80]!r} cannot be set for a run{hint}; allowed: "
                             f"{', '.join(sorted(NCCL_SETTABLE))}")
        if not VALUE_RE.fullmatch(value):
            raise ValueError(f"nccl_env: {name}={value[:80]!r}: a value is 1-128 characters of letters, digits "
                             "and _ . , : ^ = + - (no spaces, no paths)")
    return settings


def settings_finding(settings: dict[str, str]) -> list[str]:
    if not settings:
        return []
    return ["NCCL settings for this run: " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) + "."]


def echo_nccl_env(run):
    """Wrap a distributed tool's run(): its result says which NCCL settings the run had, on every way out."""
    @functools.wraps(run)   # keeps run.__module__: the runner finds the tool's spec through it
    def wrapped(params, progress):
        result = run(params, progress)
        if params.nccl_env and result.job is None:
            result.nccl_env = dict(params.nccl_env)
            result.findings.extend(settings_finding(params.nccl_env))
        return result
    return wrapped
