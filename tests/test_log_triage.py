"""log_triage against real logs (gloo failures made by tests/fixtures/logs/make_gloo_logs.py) and logs that
follow torch / NCCL / SLURM / kernel formats line for line (tests/fixtures/logs/README.md says what each shows)."""

import gzip
import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from pydantic import ValidationError

from tools.engine.data import IMPORT_ROOT as REPO_ROOT, load_data
from tools.engine.registry import registry
from tools.engine.spec import ToolFailure
from tools.log_triage import LogTriageParams, run
from tools.shared.logscan import format_ranks, timestamp_key
from tools.shared.triage.signatures import load_signatures
from tools.shared.triage.core import triage_paths, triage_text

LOGS = Path(__file__).parent / "fixtures" / "logs"

CATALOG = set(registry())  # the catalog is the registry: names are checked against README and SKILL.md
PAGES = {
    "compute": "accelerators mamf theoretical-vs-achievable throttling-and-clocks gpu-faults amd",
    "cpu-memory": "numa-binding pinned-memory host-memory dev-shm",
    "network": "intra-node inter-node busbw expected-bandwidth nccl-env nccl-debugging",
    "storage": "checkpoint-io shared-filesystems small-files storage-benchmarking",
    "orchestration": "slurm launchers fault-tolerance kubernetes",
    "training": "memory-math parallelism throughput-tuning mixed-precision instabilities checkpoints reproducibility",
    "inference": "kv-cache serving-metrics batching",
    "debugging": "hangs cuda-errors oom nans logs version-drift",
    "testing": "tiny-models multi-gpu-testing",
    "insights": "upgrade-roi choosing-a-cluster lessons",
}
AGREED_URIS = {f"knowledge://{area}/{page}.md" for area, pages in PAGES.items() for page in pages.split()}


def _ids(result):
    return [s.id for s in result.signatures]


def _sig(result, sig_id):
    return next(s for s in result.signatures if s.id == sig_id)


# ---------------------------------------------------------------------------------------------------
# The catalog

def test_catalog_has_at_least_40_signatures_each_matching_its_own_example():
    sigs = load_signatures()
    assert len(sigs) >= 40
    assert len({s.id for s in sigs}) == len(sigs)
    for sig in sigs:
        assert sig.regex.search(sig.example), f"{sig.id}: pattern does not match its example"
        assert any(k in sig.example.lower() for k in sig.keywords), f"{sig.id}: no keyword in its example"
        assert all(k == k.lower() for k in sig.keywords), sig.id
        assert sig.severity in ("error", "warn") and sig.role in ("cause", "cascade"), sig.id
        for step in sig.next:
            assert step in CATALOG or step in AGREED_URIS, f"{sig.id}: next step {step!r} is not a tool or agreed page"


@pytest.mark.parametrize("sig", load_signatures(), ids=lambda s: s.id)
def test_each_signature_is_found_inside_an_ordinary_log(sig):
    filler = [f"[rank1]:[I1129 10:00:{i % 60:02d}.0 1 train.py:9] step {i} loss 2.{i} lr 3e-4" for i in range(300)]
    text = "\n".join(filler[:150] + [sig.example] + filler[150:]) + "\n"
    result = triage_text(text, max_signatures=100)
    assert sig.id in _ids(result)
    assert _sig(result, sig.id).first == "<text>:151"


def test_every_signature_cites_a_source():
    for raw in load_data("log_signatures")["signature"]:
        assert raw.get("sources") and all(u.startswith("https://") for u in raw["sources"]), raw["id"]


def test_xid_table_explains_hardware_codes():
    xid = load_data("log_signatures")["xid"]
    assert {"48", "63", "64", "74", "79", "94", "95"} <= set(xid)


# ---------------------------------------------------------------------------------------------------
# Real gloo failures (CPU torchrun, torch 2.13)

def test_crash_names_the_rank_that_raised_not_the_peer_that_lost_its_connection():
    result = triage_paths([LOGS / "gloo_crash.log"])
    assert result.verdict == "fail"
    assert result.first_failure.rank == 1
    assert "ValueError: bad batch" in result.first_failure.text
    assert _sig(result, "peer_connection_closed").ranks == "0"
    assert any("root cause names rank 1" in f for f in result.findings)


def test_hang_names_the_silent_rank_although_torchrun_blames_the_one_that_timed_out():
    result = triage_paths([LOGS / "gloo_hang.log"])
    assert result.first_failure.signature == "gloo_timeout" and result.first_failure.role == "cascade"
    assert any("root cause names rank 0" in f for f in result.findings)
    assert result.findings[0].startswith("Suspect: rank 1. Rank 0 timed out") and "rank 1 reports no error" in result.findings[0]
    assert result.suspect_ranks == [1]


def test_size_mismatch_is_reported_with_the_sizes():
    result = triage_paths([LOGS / "gloo_size_mismatch.log"])
    hit = _sig(result, "gloo_size_mismatch")
    assert result.first_failure.signature == "gloo_size_mismatch"  # not the generic "terminate called" above it
    assert "Received data size" in _sig(result, "cpp_terminate").details["what"]
    assert hit.count == 2
    assert {hit.details["got"], hit.details["expected"]} <= {"1000", "992", "1004"}


# ---------------------------------------------------------------------------------------------------
# Format-faithful logs

def test_oom_on_rank_3_is_the_first_failure_and_called_fragmentation():
    result = triage_paths([LOGS / "torchrun_oom_rank3.log"])
    ff = result.first_failure
    assert (ff.signature, ff.rank) == ("cuda_oom", 3)
    assert ff.details["tried_gib"] == "2.00" and ff.details["reserved_unallocated_gib"] == "6.50"
    assert ff.details["fragmentation"] == "yes"
    assert any("fragmentation" in f and "expandable_segments" in f for f in result.findings)
    # the file name says rank3, but its lines carry their own labels: torchrun's lines get no rank
    assert _sig(result, "torchrun_sigterm_workers").ranks == ""
    assert result.by_rank == {"1": "nccl_remote_error", "3": "cuda_oom"}
    assert "By rank, first error: rank 1: NCCL remote process exited or network error; rank 3: CUDA out of memory." \
        in result.findings


def test_old_oom_format_without_fragmentation():
    line = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; "
            "14.56 GiB already allocated; 3.06 MiB free; 14.66 GiB reserved in total by PyTorch)")
    result = triage_text(line)
    assert result.first_failure.details["fragmentation"] == "no"
    assert any("not fragmentation" in f for f in result.findings)


def test_watchdog_timeouts_on_ranks_0_to_6_point_at_rank_7():
    result = triage_paths([LOGS / "torchrun_nccl_watchdog_8ranks.log"])
    wd = _sig(result, "nccl_watchdog_timeout")
    assert (wd.count, wd.ranks) == (7, "0-6")
    assert wd.details["op"] == "ALLREDUCE" and wd.details["seq"] == "1580" and wd.details["timeout_ms"] == "600000"
    assert any("Ranks 0-6 timed out" in f and "rank 7 (GPU 7) reports no error" in f for f in result.findings)
    assert result.suspect_ranks == [7]
    assert result.first_failure.role == "cascade"


def test_watchdog_op_mismatch_at_one_seqnum_is_called_out():
    lines = [f"[rank{r}]:[E816 01:45:40.18 1 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
             f"operation timeout: WorkNCCL(SeqNum=80078, OpType={'BROADCAST' if r == 7 else 'ALLREDUCE'}, "
             "NumelIn=5056, NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out."
             for r in range(8)]
    result = triage_text("\n".join(lines))
    assert any("Collective mismatch at SeqNum 80078" in f and "rank 7 in BROADCAST" in f for f in result.findings)


def test_srun_labels_and_kernel_log_xid_come_first_by_time_stamp():
    result = triage_paths([LOGS / "slurm_xid"])
    ff = result.first_failure
    assert ff.signature == "xid" and ff.details["xid"] == "79"
    assert ff.location.endswith("syslog-gpu-node02.log:3")  # read second, but earlier in time
    assert _sig(result, "nccl_unhandled_cuda_error").ranks == "12"
    assert _sig(result, "nccl_remote_error").ranks == "0,4,8,13"
    assert result.ranks_seen == "0-15"


def test_rank_comes_from_per_rank_file_names():
    result = triage_paths([str(LOGS / "rank_files" / "rank*.log")])
    assert (result.first_failure.signature, result.first_failure.rank) == ("dataloader_worker_killed", 2)
    # rank 2 is the one whose own log names the cause: it must not be listed among the quiet ranks
    assert not any("rank 2 reports no error" in f for f in result.findings)
    assert 2 not in result.suspect_ranks
    assert _sig(result, "nccl_watchdog_timeout").ranks == "0-1,3"


def test_nan_loss_after_fp16_overflows():
    result = triage_paths([LOGS / "nan_fp16.log"])
    assert result.first_failure.signature == "loss_nan"
    assert result.first_failure.location.endswith(":57")
    assert _sig(result, "fp16_overflow_skip").count == 18
    assert any("loss scale fell to 0.25" in f for f in result.findings)


def test_slurm_time_limit_is_the_cause_and_the_launcher_signal_its_cascade():
    result = triage_paths([LOGS / "slurm_time_limit.out"])
    assert result.first_failure.signature == "slurm_time_limit"
    assert "launcher_signalled" in _ids(result) and "slurm_cancelled" not in _ids(result)
    assert "slurm_job_diagnose" in result.next


def test_clean_log_is_ok_and_says_so():
    result = triage_paths([LOGS / "clean_training.log"])
    assert result.verdict == "ok" and result.first_failure is None and result.signatures == []
    assert "No known failure signature in 202 lines" in result.findings[0]


def test_evidence_and_output_are_bounded():
    lines = [f"[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered {'x' * 2000}"
             for r in range(64)]
    result = triage_text("\n".join(lines), evidence_lines=2)
    hit = _sig(result, "cuda_illegal_memory_access")
    assert hit.count == 64 and hit.ranks == "0-63" and len(hit.evidence) == 2
    assert all(len(e) < 600 for e in hit.evidence)


# ---------------------------------------------------------------------------------------------------
# Bad input: clear errors or a clear "nothing found", never a traceback

def test_missing_path_is_a_clear_error():
    with pytest.raises(ToolFailure, match="no such file or directory"):
        triage_paths(["/nonexistent/train.log"])
    with pytest.raises(ToolFailure, match="matches no file"):
        triage_paths(["/nonexistent/*.log"])


def test_a_directory_without_logs_is_a_clear_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 100)
    with pytest.raises(ToolFailure, match="no files to read.*safetensors"):
        triage_paths([tmp_path])


def test_empty_file_is_reported_as_empty(tmp_path):
    (tmp_path / "empty.log").write_text("")
    result = triage_paths([tmp_path / "empty.log"])
    assert result.verdict == "info" and result.findings[0] == "The log is empty."


def test_binary_garbage_alone_is_a_clear_error_and_skipped_in_a_directory(tmp_path):
    (tmp_path / "garbage.bin.log").write_bytes(os.urandom(100_000))
    with pytest.raises(ToolFailure, match="binary content"):
        triage_paths([tmp_path / "garbage.bin.log"])
    (tmp_path / "train.log").write_text("OSError: [Errno 28] No space left on device\n")
    result = triage_paths([tmp_path])
    assert result.first_failure.signature == "no_space_left"
    assert any("garbage.bin.log" in s and "binary" in s for s in result.files_skipped)


def test_gzip_and_truncated_gzip_are_read(tmp_path):
    data = (LOGS / "torchrun_oom_rank3.log").read_bytes()
    (tmp_path / "a.log.gz").write_bytes(gzip.compress(data))
    (tmp_path / "b.log.gz").write_bytes(gzip.compress(data)[:-30])
    for name in ("a.log.gz", "b.log.gz"):
        assert triage_paths([tmp_path / name]).first_failure.signature == "cuda_oom"


def test_params_need_exactly_one_input():
    with pytest.raises(ValidationError, match="either paths"):
        LogTriageParams()
    with pytest.raises(ValidationError, match="either paths"):
        LogTriageParams(paths=["a.log"], text="x")
    assert run(LogTriageParams(text="Segmentation fault (core dumped)"), lambda f, m: None).verdict == "fail"


def test_a_huge_line_without_newlines_is_cut_not_loaded_whole(tmp_path):
    path = tmp_path / "one_line.log"
    with open(path, "wb") as f:
        f.writelines(b"x" * (1 << 20) for _ in range(12))
        f.write(b" Stale file handle\n")
    result = triage_paths([path])
    assert result.first_failure.signature == "stale_file_handle"


# ---------------------------------------------------------------------------------------------------
# Size: a log far larger than the memory the scan may use (scan speed is ~30 MB/s on one idle core of
# the CI machine, so 128 MiB keeps this test near 5 s; memory does not grow with the size)

@pytest.mark.slow
def test_large_log_streams_in_bounded_memory(tmp_path):
    path = tmp_path / "big.log"
    block = "".join(f"[rank{i % 8}]:[I1129 12:00:{i % 60:02d}.5 1 train.py:88] step {i} | loss: 2.{i % 97:02d} | "
                    f"grad_norm: 0.93 | lr 3.0e-4 | tokens/s 123456 | mem 71.2 GiB\n" for i in range(4000))
    reps = (128 << 20) // len(block)
    with open(path, "w") as f:
        f.writelines(block for _ in range(reps // 2))
        f.write("[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 5 has a "
                "total capacity of 79.19 GiB of which 0.50 GiB is free.\n")
        f.writelines(block for _ in range(reps - reps // 2))
    size = path.stat().st_size
    tracemalloc.start()
    result = triage_paths([path], workers=1)  # one process, so that tracemalloc sees all of the scan
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert size > 120 << 20
    assert peak < 40 << 20, f"peak {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB log"
    assert (result.first_failure.signature, result.first_failure.rank) == ("cuda_oom", 5)
    assert result.first_failure.location.endswith(f":{block.count(chr(10)) * (reps // 2) + 1}")
    assert result.bytes_scanned == size


# ---------------------------------------------------------------------------------------------------
# Small pieces

def test_timestamps_and_rank_ranges():
    assert timestamp_key("[rank0]:[E1206 18:44:12.715298746 1 x.cpp:1] boom") == (12, 6, 18 * 3600 + 44 * 60 + 12.715298746)
    assert timestamp_key("[2024-05-08 08:47:31,261] torch.distributed") == (5, 8, 8 * 3600 + 47 * 60 + 31.261)
    assert timestamp_key("[Sun Nov 29 12:01:02 2026] NVRM: Xid") == (11, 29, 12 * 3600 + 60 + 2)
    assert timestamp_key("no time here") is None
    assert format_ranks([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8" and format_ranks([]) == ""


def test_command_line_json():
    out = subprocess.run([sys.executable, "-m", "tools.log_triage", "--paths", str(LOGS / "torchrun_oom_rank3.log"),
                          "--json"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    result = json.loads(out.stdout)
    assert result["verdict"] == "fail" and result["first_failure"]["rank"] == 3
    assert re.search(r"torchrun_oom_rank3\.log:18$", result["first_failure"]["location"])


def test_step_counters_are_not_taken_for_srun_labels():
    lines = [f"{step}: loss 2.3 lr 1e-4" if step % 10 == 0 else f"step {step} ok" for step in range(1, 300)]
    lines.append("[rank0]:[E1129 10:00:00.0 1 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
                 "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                 "600013 milliseconds before timing out.")
    result = triage_text("\n".join(lines))
    assert result.ranks_seen == "0"
    assert not any("reports no error" in f or "report no error" in f for f in result.findings)


def test_windows_line_endings():
    result = triage_text("step 1\r\n[rank2]: OSError: [Errno 28] No space left on device\r\nstep 2\r\n")
    assert (result.first_failure.signature, result.first_failure.rank) == ("no_space_left", 2)
    assert not result.first_failure.text.endswith("\r")


def test_a_big_file_split_over_processes_gives_the_same_answer(tmp_path):
    path = tmp_path / "split.log"
    rng = __import__("random").Random(7)
    examples = {s.id: s.example for s in load_signatures() if not s.fallback}
    ids = sorted(examples)
    with open(path, "w") as f:
        for i in range(60_000):
            if i % 997 == 0:
                f.write(f"[rank{i % 16}]: {examples[rng.choice(ids)]}\n")
            else:
                f.write(f"[rank{i % 16}]:[I1129 12:00:{i % 60:02d}.5 1 train.py:88] step {i} loss 2.{i % 97:02d}\n")
    one = triage_paths([path], workers=1, max_signatures=100, evidence_lines=5)
    three = triage_paths([path], workers=3, max_signatures=100, evidence_lines=5)
    assert one.first_failure == three.first_failure
    assert [(s.id, s.count, s.ranks, s.first, s.evidence, s.details) for s in one.signatures] == \
        [(s.id, s.count, s.ranks, s.first, s.evidence, s.details) for s in three.signatures]
    assert (one.lines_scanned, one.bytes_scanned, one.by_rank) == (three.lines_scanned, three.bytes_scanned,
                                                                   three.by_rank)
    assert one.findings[:-1] == three.findings[:-1]  # the last one is the timing


# ---------------------------------------------------------------------------------------------------
# Real GPU failures (tests/fixtures/logs/real/, made on the GPU machine by scripts/gpu_nccl_logs.sh)

REAL = LOGS / "real"


def _real(name):
    path = REAL / name
    if not path.exists():
        pytest.skip(f"{path} not made yet (scripts/gpu_nccl_logs.sh on the GPU machine)")
    return triage_paths([path])


def test_real_nccl_watchdog_names_the_sleeping_rank():
    result = _real("watchdog_2gpu.log")
    assert _sig(result, "nccl_watchdog_timeout").ranks == "0"
    assert any("rank 1 reports no error" in f for f in result.findings)


def test_real_cuda_oom():
    result = _real("cuda_oom_1gpu.log")
    assert result.first_failure.signature == "cuda_oom"
    assert result.first_failure.details["tried_gib"] == "1024.00"


def test_real_device_side_assert():
    result = _real("device_assert_1gpu.log")
    assert {"cuda_device_side_assert", "cuda_kernel_assert"} & set(_ids(result))
    assert result.first_failure.signature in ("cuda_device_side_assert", "cuda_kernel_assert")


def test_a_sigkilled_rank_in_torchruns_summary_is_the_cause():
    text = "\n".join(["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "=" * 44,
                      "train.py FAILED", "-" * 44, "Root Cause (first observed failure):", "[0]:",
                      "  rank      : 5 (local_rank: 5)", "  exitcode  : -9 (pid: 81723)", "  error_file: <N/A>",
                      "  traceback : Signal 9 (SIGKILL) received by PID 81723", "=" * 44])
    ff = triage_text(text).first_failure
    assert (ff.signature, ff.rank, ff.role) == ("torchrun_child_failed", 5, "cause")
    assert ff.details["exit_meaning"].startswith("SIGKILL")


VARIANTS = [
    (("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
     "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out."), "nccl_watchdog_timeout"),
    (("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB "
     "of which 1.10 GiB is free."), "cuda_oom"),
    ("RuntimeError: CUDA driver error: out of memory", "cuda_oom"),
    ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", "cuda_illegal_memory_access"),
    ("srun: error: gpu-node01: tasks 0-7: Killed", "srun_task_failed"),
    ("[Tue Nov 24 03:12:44 2026] Out of memory: Killed process 81723 (python) total-vm:412GB, anon-rss:398GB",
     "oom_killer"),
    ("[Tue Nov 24 03:12:44 2026] Memory cgroup out of memory: Killed process 4242 (pt_main_thread)", "oom_killer"),
    ("iteration     1200/  500000 | lm loss: 7.123E+00 | loss scale: 1.0 | grad norm: inf | skipped: 1",
     "grad_norm_nan"),
    ("Loss is nan, stopping training", "loss_nan"),
    ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0", "fp16_overflow_skip"),
    (("NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit error (DBE) has been "
     "detected on GPU in the framebuffer at partition 0, subpartition 0."), "xid"),
    ("OSError: [Errno 122] Disk quota exceeded", "disk_quota_exceeded"),
    ("cp: error writing '/scratch/ckpt/model.pt': No space left on device", "no_space_left"),
    (("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to connect to "
     "(10.0.0.1, 29500)."), "rendezvous_timeout"),
    (("[W1129 socket.cpp:752] [c10d] The client socket has failed to connect to [node-0]:29500 (errno: 113 - No route "
     "to host)."), "rendezvous_connection_error"),
    (("node1:12:34 [0] transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, "
     "vendor err 129"), "nccl_ib_completion_error"),
]


@pytest.mark.parametrize(("line", "sig_id"), VARIANTS, ids=[v[1] + str(i) for i, v in enumerate(VARIANTS)])
def test_format_variants_across_versions(line, sig_id):
    assert sig_id in _ids(triage_text(line))


def test_culprits_named_by_the_message_itself():
    r = triage_text("RuntimeError: [Rank 0]: Ranks 3, 7 failed to pass monitoredBarrier in 30000 ms")
    assert any("rank(s) 3, 7 as not arriving within 30 s" in f for f in r.findings)
    r = triage_text("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 15/16 clients "
                    "joined.")
    assert any(f.startswith("Only 15 of 16 processes reached the store") for f in r.findings)


def test_a_rank_that_goes_quiet_is_a_suspect_even_without_errors():
    lines = []
    for minute in range(30):
        for rank in range(8):
            if rank != 5 or minute < 12:
                lines.append(f"[rank{rank}]:[I1129 10:{minute:02d}:0{rank}.000 1 train.py:90] step {minute * 10} loss 2.1")
    result = triage_text("\n".join(lines))
    assert result.signatures == [] and result.verdict == "warn" and result.suspect_ranks == [5]
    assert any(f.startswith("Rank 5 stopped writing first: its last line at 10:11:05") for f in result.findings)
