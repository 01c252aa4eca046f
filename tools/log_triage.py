"""log_triage — known failure signatures in training / job logs: the first failure, per rank, with evidence.

Reads log files (any size, streamed in bounded memory; .gz too; plain files over 96 MiB are split over
worker processes), directories (recursively), globs or pasted text, and matches every line against the
signature catalog in knowledge/data/log_signatures.toml
(NCCL watchdog timeouts, CUDA OOM, XID, NaN loss, OOM killer, SLURM time limit, ...). It understands
rank prefixes (torchrun `[rank3]:` / `[default3]:`, srun `--label` `3: `, mpirun `[1,3]<stdout>:`) and
per-rank file names (`rank3.log`, torchelastic `attempt_0/3/stderr.log`), and reports, for each
signature, the count, the ranks, the first occurrence and a few evidence lines; then the chronological
first failure: the first *cause* (OOM, XID, exception), not the cascade it set off on the other ranks
(watchdog timeouts, "connection closed by peer", torchrun's ChildFailedError).

By hand (no GPU needed, it only reads files):
    mleng run log_triage --paths train.log
    mleng run log_triage --paths 'logs/*.err' slurm-1234.out --json
    mleng run log_triage --text "$(tail -n 2000 train.log)"
One GPU or one node: the torchrun output (torchrun labels lines `[rankN]:`), or the per-rank files of
`torchrun --log-dir DIR --redirects 3` (`mleng run log_triage --paths DIR`; the rank taken from
`attempt_N/<r>/stderr.log` is the local rank, which is the rank on one node).
Under SLURM: the job's output, ideally from `srun --label` so every line carries its rank:
    mleng run log_triage --paths slurm-$SLURM_JOB_ID.out /var/log/kern.log
(slurm_job_diagnose finds a job's files itself and calls triage_paths on them).

The triage itself lives in tools/shared/triage/ (slurm_job_diagnose uses it too): this file is
the tool's inputs and spec. It runs as a subprocess, so a scan of a huge log (and its worker
processes) stops at the deadline or on cancel like any other run.
"""

from .engine.spec import SELF_EVIDENT, Field, Progress, ToolSpec
from .shared.logscan import LogInputParams
from .shared.triage.core import LogTriageResult, triage_paths, triage_text


class LogTriageParams(LogInputParams):
    max_signatures: int = Field(12, ge=1, le=100,
            json_schema_extra=SELF_EVIDENT, description="Distinct signatures, at most.")
    evidence_lines: int = Field(3, ge=0, le=20, json_schema_extra=SELF_EVIDENT, description="Lines kept per signature.")



def run(params: LogTriageParams, progress: Progress) -> LogTriageResult:
    if params.text:
        return triage_text(params.text, max_signatures=params.max_signatures, evidence_lines=params.evidence_lines)
    return triage_paths(params.paths, max_files=params.max_files, max_signatures=params.max_signatures,
                        evidence_lines=params.evidence_lines, progress=progress)


SPEC = ToolSpec(
    name="log_triage",
    summary="Find known failure signatures in training / job logs and name the first failure, per rank.",
    description=(
        "Use when a run crashed, died or failed and there is output to read (a torchrun / srun / SLURM output "
        "file, per-rank logs, a directory, or pasted text): matches 70+ signatures (NCCL watchdog timeouts: "
        "'Watchdog caught collective operation timeout' with op and SeqNum, 'last enqueued / last completed "
        "NCCL work', NCCL errors, CUDA OOM, illegal memory access, device-side assert, Xid / ECC, NaN loss, "
        "OOM killer / exit 137 / Killed, Segmentation fault with no Python traceback, torchrun "
        "ChildFailedError and its Root Cause rank, rendezvous failures, SLURM time limit, disk full, stale "
        "NFS handle, Bus error, dataloader deaths, version mismatches) and names the chronologically first "
        "cause, not the cascade, per rank with evidence. Files of any size. Not for NCCL_DEBUG=INFO logs "
        "(nccl_log_analyze), dumps (flight_recorder_analyze) or a hang with a silent log (hang_stack_dump)."),
    Params=LogTriageParams, Result=LogTriageResult, run=run,
    runs="subprocess", read_only=True, destructive=False, idempotent=True, open_world=False,
    timeout_s=600, store=True,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
