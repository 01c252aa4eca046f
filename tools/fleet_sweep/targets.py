"""Which nodes a sweep covers and how they are reached: the allocation we run in, a running job,
a partition and node count (a job of our own), or a host list of SLURM nodes, all through srun; a
host list without SLURM (or with MLENG_TRANSPORT=ssh) through SSH (engine/transport.py), and
hosts=["localhost"] by starting the node process here directly.

Every bad input raises ToolFailure naming the field (job_id, partition, nodes, hosts) and what is
accepted. Nodes SLURM already knows to be unreachable (down, not responding, drained) are left out
of the step and reported with SLURM's state as the reason, so one dead slurmd cannot abort the
launch on every other node.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ..engine.placement import inside_allocation, inside_job, own_job
from ..engine.spec import ToolFailure
from ..engine.transport import node_set
from ..shared import slurm
from ..shared.slurm import unreachable_reason
from ..shared.launch import over_ssh



@dataclass
class Target:
    kind: str                       # allocation | job | partition | hosts | ssh | local
    nodes: list[str]                # every node the sweep is about
    srun_args: list[str]            # where the step runs (--jobid/--overlap, or -p for a job of our own)
    skipped: dict[str, str] = field(default_factory=dict)   # node -> why it is not launched on
    # A partition's nodes that SLURM would not start a task on, left out of `nodes` (a sweep of "the partition"
    # must still say them: a model read "partition (3 nodes)" as the whole partition clean, its DOWN node unsaid).
    left_out: dict[str, str] = field(default_factory=dict)
    local: bool = False             # this machine only: the node process runs here, no srun

    @property
    def launch_nodes(self) -> list[str]:
        return [n for n in self.nodes if n not in self.skipped]


def node_states(nodes: list[str]) -> dict[str, str]:
    """node -> SLURM state as sinfo prints it (`idle`, `mixed`, `down*`, `drained`...)."""
    joined = ",".join(nodes)
    # One argv string may not pass 128 KiB (Linux MAX_ARG_STRLEN: E2BIG at ~10^4 names): a longer list
    # asks for every node and keeps ours.
    names = ["-n", joined] if len(joined) < 100_000 else []
    out = slurm.run_cmd(["sinfo", "-h", "-N", *names, "-o", "%N %T"], timeout_s=30)
    wanted, states = set(nodes), {}
    for line in out.splitlines():
        name, _, state = line.strip().partition(" ")
        if name in wanted:
            states.setdefault(name, state.strip().lower())
    return states


def check_known(nodes: list[str], field_name: str) -> dict[str, str]:
    """States of `nodes`; ToolFailure naming the field when one is not a SLURM node."""
    states = node_states(nodes)
    unknown = [n for n in nodes if n not in states]
    if unknown:
        raise ToolFailure(f"{field_name}: unknown node(s) {', '.join(unknown[:10])}: not in `sinfo -N`. Give "
                          "SLURM node names (sinfo -N -o %N lists them).")
    return states


def skip_unreachable(nodes: list[str], states: dict[str, str]) -> dict[str, str]:
    return {n: why for n in nodes if (why := unreachable_reason(states.get(n, "unknown")))}


def from_allocation(env: dict) -> Target:
    nodes = slurm.allocation_nodes(env)
    states = check_known(nodes, "SLURM_JOB_NODELIST")
    return Target("allocation", nodes, list(inside_allocation().srun_args), skip_unreachable(nodes, states))


def from_job(job_id: str) -> Target:
    try:
        env = slurm.job_allocation_env(job_id)
    except slurm.SlurmError as exc:
        raise ToolFailure(f"job_id: {exc}") from None
    nodes = slurm.allocation_nodes(env)
    states = check_known(nodes, "job_id")
    return Target("job", nodes, list(inside_job(job_id).srun_args), skip_unreachable(nodes, states))


def partition_nodes(partition: str) -> list[str]:
    out = slurm.run_cmd(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], timeout_s=30)
    nodes = list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))
    if not nodes:
        known = slurm.run_cmd(["sinfo", "-h", "-o", "%R"], timeout_s=30).split()
        raise ToolFailure(f"partition: unknown or empty partition {partition!r}; partitions here: "
                          f"{', '.join(sorted(set(known))) or '(none)'}")
    return nodes


def from_partition(partition: str, count: int | None, deadline_s: float) -> Target:
    nodes = partition_nodes(partition)
    states = node_states(nodes)
    skipped = skip_unreachable(nodes, states)
    usable = [n for n in nodes if n not in skipped]
    count = count or len(usable)
    if count > len(usable):
        raise ToolFailure(f"nodes: partition {partition!r} has {len(usable)} reachable node(s) of {len(nodes)}; "
                          f"ask for at most {len(usable)} (down or drained: {', '.join(skipped) or 'none'})")
    return Target("partition", usable[:count], list(own_job(partition, deadline_s).srun_args), left_out=skipped)


def from_hosts(hosts: list[str], partition: str | None, deadline_s: float) -> Target:
    if not hosts:
        raise ToolFailure("hosts: the host list is empty; give at least one SLURM node name")
    # Counted before anything is expanded: 'n[0-99999999]' is 14 characters and 10^8 names.
    try:
        total = sum(slurm.hostlist_size(item) for item in hosts)
        if total > slurm.MAX_HOSTS:
            raise ValueError(f"the list expands to {total} names; at most {slurm.MAX_HOSTS} are accepted")
        nodes = list(dict.fromkeys(h for item in hosts for h in slurm.expand_hostlist(item)))
    except ValueError as exc:
        raise ToolFailure(f"hosts: {exc}") from None
    states = check_known(nodes, "hosts")
    return Target("hosts", nodes, list(own_job(partition, deadline_s).srun_args), skip_unreachable(nodes, states))


LOCAL_NAMES = ("localhost", "127.0.0.1")


def is_this_machine(hosts: list[str]) -> bool:
    me = {socket.gethostname(), socket.gethostname().split(".")[0], *LOCAL_NAMES}
    return bool(hosts) and all(h in me for h in hosts)


def from_ssh_hosts(hosts: list[str]) -> Target:
    """Hosts reached over SSH: names as the caller's ssh_config knows them, checked before ssh sees them."""
    try:
        return Target("ssh", node_set(hosts, slurm.MAX_HOSTS), [])
    except ValueError as exc:
        raise ToolFailure(f"hosts: {exc}") from None


def resolve(params, env: dict) -> Target:
    """The target from the params (hosts, job_id, partition) or, by default, our allocation."""
    if params.hosts is not None and is_this_machine(params.hosts):
        return Target("local", [socket.gethostname()], [], local=True)
    if params.hosts is not None and over_ssh(env):
        return from_ssh_hosts(params.hosts)
    if not slurm.client_configured(env) and not slurm.in_allocation(env):
        raise ToolFailure("fleet_sweep reaches nodes through SLURM (one srun step) or, with hosts=[...], over SSH, and "
                          "this machine has no SLURM client or slurm.conf: give hosts (names your ssh reaches with "
                          "keys and known host keys), or run it on a login node or set SLURM_CONF.")
    if params.hosts is not None:
        return from_hosts(params.hosts, params.partition, params.deadline_s)
    if params.job_id:
        return from_job(params.job_id)
    if params.partition:
        return from_partition(params.partition, params.nodes, params.deadline_s)
    if slurm.in_allocation(env):
        return from_allocation(env)
    raise ToolFailure("no target: run inside a SLURM allocation (salloc/sbatch), or give job_id (a running job), "
                      "partition (+ nodes), or hosts (SLURM node names)")
