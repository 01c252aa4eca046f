"""What to do about a health finding: one action per finding, comparable across tools.

The ladder follows the trusted suites (the AWS GPU health suite's isolate / reboot / reset / monitor,
DCGM's severities, NVIDIA's Xid catalog resolution buckets), mildest first. gpu_health, log_triage,
slurm_job_diagnose and fleet summaries all speak it, so a fleet view can take the worst action per node.
"""

from typing import Iterable, Literal

from ..engine.spec import Field, Record

Action = Literal["none", "monitor", "reset_gpu", "reboot_node", "drain_node", "replace"]
ACTIONS: tuple[Action, ...] = ("none", "monitor", "reset_gpu", "reboot_node", "drain_node", "replace")
ACTION_MEANING: dict[str, str] = {
    "none": "nothing to do on the hardware (an application fault or a setting to change)",
    "monitor": "keep using it, watch whether it grows or repeats",
    "reset_gpu": "stop the work on that GPU and reset it (nvidia-smi -r, or reboot)",
    "reboot_node": "reboot the node before the next job",
    "drain_node": "take the node out of the scheduler (SLURM: scontrol update nodename=<n> state=drain reason=...)",
    "replace": "hand the GPU (or part) to the hardware team for replacement (RMA)",
}
ACTION_FIELD = ("What to do: none | monitor | reset_gpu | reboot_node | drain_node | replace "
                "(mildest first; the worst one decides for the node).")


class HealthFinding(Record):
    """One health fact with the action it calls for."""

    text: str = Field(description="What is wrong (or notable), one sentence with numbers and units.")
    action: Action = Field("monitor", description=ACTION_FIELD)
    subject: str = Field("node", description="What it is about: 'GPU 3 (0000:3b:00.0)', 'node', 'rank 5', 'mlx5_1'.")
    code: str = Field("", description="Machine code when there is one: 'xid 79', 'DCGM_FR_PCIE_WIDTH', 'nvlink_crc'.")
    source: str = Field("", description="Where it was seen: nvml, sysfs, kernel log, dcgm, log file:line.")


def action_rank(action: str) -> int:
    """Position on the ladder; ValueError names the accepted values for anything else."""
    try:
        return ACTIONS.index(action)  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"unknown action {action!r}: accepted are {', '.join(ACTIONS)}") from None


def worst_action(actions: Iterable[str]) -> Action:
    """The strongest action of several ('none' when there are none)."""
    return max(actions, key=action_rank, default="none")  # type: ignore[return-value]


def escalate(action: str, repeated: bool, on_repeat: str) -> Action:
    """The action to take now: on_repeat when the fault came back, never milder than the first action."""
    return worst_action([action, on_repeat]) if repeated else action  # type: ignore[return-value]


def by_action(findings: Iterable[HealthFinding]) -> dict[str, list[str]]:
    """{action: [subjects]} worst first, for fleet summaries ('drain_node': ['node07', ...])."""
    out: dict[str, list[str]] = {}
    for f in sorted(findings, key=lambda f: -action_rank(f.action)):
        if f.action != "none" and f.subject not in out.setdefault(f.action, []):
            out[f.action].append(f.subject)
    return {a: s for a, s in out.items() if s}


def verdict_of(action: str) -> str:
    """The ok / warn / fail a finding's action implies: monitor warns, a reset or stronger fails."""
    rank = action_rank(action)
    return "fail" if rank >= action_rank("reset_gpu") else "warn" if rank >= action_rank("monitor") else "ok"
