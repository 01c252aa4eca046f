"""A job launched without SLURM (torchrun over ssh), sampled on every host at once: the straggler_find step
(step.py) through the SSH transport (engine/transport.py: BatchMode, known host keys only, argv quoted once).

On each host the node finds the job's ranks by torchrun's rendezvous id or the launcher's command line,
keeping only the caller's own processes (shared/process_targets/runs.py).
"""

from .models import NodeReport
from .step import sample_nodes
from ..engine.spec import ToolFailure
from ..engine.transport import SshTransport, node_set

MAX_HOSTS = 64


def hosts_of(hosts: list[str]) -> list[str]:
    """Plain host names from the caller's node sets, at most MAX_HOSTS; ToolFailure saying what is wrong."""
    try:
        return node_set(hosts, limit=MAX_HOSTS)
    except ValueError as e:
        raise ToolFailure(f"hosts: {e} (straggler_find samples at most {MAX_HOSTS} hosts at once)") from None


def sample_hosts(hosts: list[str], spec: dict, progress) -> tuple[list[NodeReport], list[str]]:
    """Every host's report, and what went wrong on the way (a host unreachable, silent, or without a report)."""
    nodes = hosts_of(hosts)
    named = f"run {spec['run_id']}" if spec.get("run_id") else f"the job launched by {spec['launcher_match']!r}"
    progress(0.05, f"sampling {named} on {len(nodes)} host(s) over ssh for {spec['window_s']:.0f} s")
    return sample_nodes(SshTransport(), nodes, spec, progress)
