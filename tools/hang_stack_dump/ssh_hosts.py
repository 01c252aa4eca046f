"""Every host of a job launched without SLURM (torchrun over ssh), dumped at once: the per-node dump step
(step.py) through the SSH transport. On each host the dump finds the job by `--run-id` or `--launcher-match`
(shared/process_targets/runs.py).
"""

from .stacks import ProcessStack
from .step import dump_nodes
from ..engine.spec import ToolFailure
from ..engine.transport import SshTransport, node_set

MAX_HOSTS = 64


def hosts_of(hosts: list[str]) -> list[str]:
    """Plain host names from the caller's node sets, at most MAX_HOSTS; ToolFailure saying what is wrong."""
    try:
        return node_set(hosts, limit=MAX_HOSTS)
    except ValueError as e:
        raise ToolFailure(f"hosts: {e} (hang_stack_dump reaches at most {MAX_HOSTS} hosts at once)") from None


def dump_hosts(nodes: list[str], argv: list[str], per_process_timeout_s: float,
               progress) -> tuple[list[ProcessStack], list[str], list[str], list[str]]:
    """(processes, problems, hosts that sent no report, processes the hosts left out)."""
    return dump_nodes(SshTransport(), nodes, argv, per_process_timeout_s, progress, "over ssh")
