"""Where a SLURM step runs: one choice for every caller that reaches nodes through srun.

    inside_allocation()                  the allocation we run in (salloc/sbatch): --overlap, beside its own steps
    inside_job("123")                    another RUNNING job's allocation: --jobid=123 --overlap
    own_job("gpu", timeout_s=600)        a job of our own: -p gpu, --time = the deadline in whole minutes + 1

Callers: the `node` call option (engine/on_node.py), fleet_sweep's targets, collective_bench's pairwise and
bisect (an allocation of their own: tools/shared/allocation.py). The engine may not import
shared, so the choice lives here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def own_job_minutes(timeout_s: float) -> int:
    """A job of our own is limited to the caller's deadline rounded up to minutes, plus one: the safety net
    should the process that started it die before it ends the step."""
    return max(1, math.ceil(timeout_s / 60) + 1)


@dataclass(frozen=True)
class Placement:
    kind: str                      # allocation | job | own_job
    srun_args: tuple[str, ...]     # what srun needs to run there

    def env(self, env: dict) -> dict:
        """The environment srun runs with: a job of our own drops the allocation we may be inside
        (srun would place the step there), keeping SLURM_CONF (which cluster)."""
        if self.kind != "own_job":
            return dict(env)
        return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def inside_allocation() -> Placement:
    return Placement("allocation", ("--overlap",))


def inside_job(job_id: str) -> Placement:
    return Placement("job", (f"--jobid={job_id}", "--overlap"))


def own_job(partition: str | None, timeout_s: float, job_name: str | None = None) -> Placement:
    return Placement("own_job", (*([f"--partition={partition}"] if partition else []),
                                 *([f"--job-name={job_name}"] if job_name else []),
                                 f"--time={own_job_minutes(timeout_s)}"))
