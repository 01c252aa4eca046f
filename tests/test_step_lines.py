"""straggler_find's step-time lines (log_paths): which lines of a training log report a step's time or rate.
Shapes: Megatron-LM's iteration line, torchtitan's step line, a time field named with an underscore, and the drills'
own workload (bench/straggler_workload.py), whose "step_ms" went unread in model round 10."""

import os

import pytest

from tools.straggler_find import _step_lines, is_step_line

STEP_LINES = [
    " iteration       10/  500000 | consumed samples: 5120 | elapsed time per iteration (ms): 1234.5 | lr: 3.0E-04",
    "step:  10  loss:  7.8765  memory: 31.2GiB(39.5%)  tps: 1,234  tflops: 123.45  mfu: 39.6%",
    "step 12 rank 0 step_ms 1234.5",
    "iter 40 loss 2.31 iter_time=0.85",
    "step 120 | 850 ms",
]
OTHER_LINES = [
    "loading checkpoint from step 1000",                  # no time word after its number
    "step_scheduler: lr 0.1 at epoch 3",                  # no step word on its own
    "saved 12 files in /ckpt/step_dirs",
    "iteration over dataset shards: 64 shards_total",     # "_total" is no time word
]


@pytest.mark.parametrize("line", STEP_LINES)
def test_a_step_time_line_is_recognised(line):
    assert is_step_line(line)


@pytest.mark.parametrize("line", OTHER_LINES)
def test_other_lines_are_not(line):
    assert not is_step_line(line)


def test_the_workloads_log_gives_its_first_and_last_three_steps(tmp_path):
    """The first beside the last three shows a creep (round 10's model could not check "step time keeps creeping up")."""
    log = tmp_path / "job-7847000.out"
    log.write_text("".join(f"step {k} rank 0 step_ms {800 + 10 * k:.1f}\n" for k in range(6)) + "result 1.0e+00\n")
    lines, _ = _step_lines([str(log)])
    assert lines == [f"job-7847000.out: step {k} rank 0 step_ms {800 + 10 * k:.1f}" for k in (0, 3, 4, 5)]
    log.write_text("".join(f"step {k} | {800 + k} ms\n" for k in range(3)))
    assert _step_lines([str(log)])[0] == [f"job-7847000.out: step {k} | {800 + k} ms" for k in range(3)]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of another user, as a root-run sweep meets them")
def test_a_jobs_stdout_is_read_only_when_it_is_the_jobs_users(tmp_path, monkeypatch):
    """Run as root, straggler_find reads a SLURM job's stdout by itself: a link the job's user put there to a file
    of root's must not be quoted."""
    import tools.straggler_find as sf
    from tools.shared.process_targets import RunningJob

    log = tmp_path / "job-5.out"
    log.write_text("".join(f"step {k} rank 0 step_ms {800 + k}.0\n" for k in range(6)))
    os.chown(log, 65534, 65534)
    secret = tmp_path / "root-only"
    secret.write_text("step 1 of the secret took 3 ms\n")
    link = tmp_path / "job-6.out"
    link.symlink_to(secret)
    monkeypatch.setattr(sf, "running_job", lambda job_id: RunningJob(job_id, "nobody", 65534, 1, "mln1"))
    for path, lines, said in ((log, 4, "Step times from the job's stdout"), (link, 0, "owned by uid 0, not the job's user")):
        monkeypatch.setattr(sf, "_job_stdout", lambda job_id, path=path: str(path))
        got, trends, note = sf._job_log_lines("5")
        assert len(got) == lines and said in note and trends == [], (got, note)   # 6 lines: too few for a trend
    monkeypatch.setattr(sf, "_job_stdout", lambda job_id: str(tmp_path / "gone.out"))
    got, trends, note = sf._job_log_lines("5")
    assert got == [] == trends and note.startswith(f"The job's stdout ({tmp_path / 'gone.out'}, as SLURM records it) could not "
                                         "be read here"), note
