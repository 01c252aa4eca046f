"""straggler_find's step-time lines (log_paths): which lines of a training log report a step's time or rate.
Shapes: Megatron-LM's iteration line, torchtitan's step line, a time field named with an underscore, and the drills'
own workload (bench/straggler_workload.py), whose "step_ms" went unread in model round 10."""

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
    assert _step_lines([str(log)]) == [f"job-7847000.out: step {k} rank 0 step_ms {800 + 10 * k:.1f}" for k in (0, 3, 4, 5)]
    log.write_text("".join(f"step {k} | {800 + k} ms\n" for k in range(3)))
    assert _step_lines([str(log)]) == [f"job-7847000.out: step {k} | {800 + k} ms" for k in range(3)]
