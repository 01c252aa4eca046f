"""Security review 2026-12-02, replayed through the real CLI (`python -m tools run ...`): R2 (a process of another
user that sets SLURM_JOB_ID/RANK is not a rank), R3 (dumps another user planted at torch's default prefix are not
evidence), R7 (a flight-recorder bomb is refused before it expands; malformed fields are errors naming the field),
R12 (`node=` results stored under the node asked for; the HTTP token never reaches srun), R14 (pid 1 or our own
process as a target is refused; another user's pid needs root's explicit allow_other_users), R15 (newlines in a
process's name do not forge lines in an error). SLURM's clients are stand-ins on PATH, as in the review: squeue
prints $FAKE_SQUEUE, srun runs its command here with a "0: " label (or as host victim-host, for R12).
"""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.engine.processes import kill_tree

ROOT = Path(__file__).resolve().parent.parent
FR_HUNG = ROOT / "evals" / "scenarios" / "fixtures" / "fr_hung"
NOBODY = 65534

SQUEUE = '#!/bin/sh\necho "$FAKE_SQUEUE"\n'
# Drops srun's options, says as srun -v does where it placed task 0 (the node --nodelist asked for: the transport
# credits a task's lines by that placement), then runs the command here, each output line labelled as task 0's.
SRUN = """#!/bin/bash
env > "$FAKE_DIR/srun-env"
host=localhost
while [ "$#" -gt 0 ] && [ "${1#-}" != "$1" ]; do case "$1" in --nodelist=*) host=${1#--nodelist=};; esac; shift; done
echo "srun: launching StepId=1.0 on host $host, 1 tasks: 0" >&2
if [ -n "$FAKE_HOST" ]; then exec unshare -u sh -c 'hostname "$FAKE_HOST" && exec "$0" "$@"' "$@"; fi
"$@" | sed -u 's/^/0: /'
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the attacks are other users' processes and files")


def _stand_ins(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "fakeslurm"
    bin_dir.mkdir()
    for name, text in (("squeue", SQUEUE), ("srun", SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
            "SLURM_CONF": "/nonexistent"}


def mleng(*args: str, env: dict | None = None, timeout: float = 240) -> tuple[int, dict | None, str]:
    """(exit code, the --json result or None, stderr) of `python -m tools run ARGS --json`."""
    proc = subprocess.run([sys.executable, "-m", "tools", "run", *args, "--json"], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**os.environ, **(env or {})})
    out = proc.stdout
    return proc.returncode, (json.loads(out[out.index("{"):]) if "{" in out else None), proc.stderr


def _spawn(code: str, env: dict, user: str | None = None) -> subprocess.Popen:
    python = [sys.executable] if user is None else [shutil.which("runuser") or "runuser", "-u", user, "--", "/usr/bin/python3"]
    proc = subprocess.Popen([*python, "-c", code], env={"PATH": "/usr/bin:/bin", **env}, cwd="/",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc


def _child_pid(proc: subprocess.Popen) -> int:
    """The Python under runuser (runuser forks it), or the process itself."""
    import psutil

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children()
        if kids or "runuser" not in " ".join(psutil.Process(proc.pid).cmdline()):
            return kids[0].pid if kids else proc.pid
        time.sleep(0.1)
    raise AssertionError("runuser started no process")


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        kill_tree(p.pid, grace_s=1)      # runuser's Python too
        p.wait()


SPIN = "import time\nwhile True: sum(range(20000)); time.sleep(0.001)"


# The review's job was 4242. Each test session claims its own id: these tests read every process of the host
# that names the job, and another session's fake ranks of a shared id (several engineers and CI run this module on
# one machine) were read as this job's too, when both ran at once.
JOB = str(42_000_000 + os.getpid())    # under SLURM's largest job id (67,043,328)


@pytest.fixture
def fake_job(tmp_path):
    """Two root "ranks" of job JOB and a nobody process that claims rank 2 of it (env only): (env, pids, impostor)."""
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("needs py-spy")
    env = _stand_ins(tmp_path)
    env["FAKE_SQUEUE"] = f"RUNNING|root|1|localhost|0|{JOB}"
    started = []
    try:
        started += [_spawn(SPIN, {"SLURM_JOB_ID": JOB, "RANK": str(r)}) for r in (0, 1)]
        started.append(_spawn(SPIN, {"SLURM_JOB_ID": JOB, "RANK": "2"}, user="nobody"))
        yield env, [p.pid for p in started[:2]], _child_pid(started[2])
    finally:
        _stop(*started)


@pytest.mark.slow
@needs_root
def test_r2_another_users_process_claiming_a_rank_is_named_not_dumped(fake_job):
    env, ranks, impostor = fake_job
    rc, result, err = mleng("hang_stack_dump", "--slurm-job-id", JOB, env=env)
    assert result is not None, err
    dumped = {p["pid"] for p in result["processes"]}
    assert impostor not in dumped and set(ranks) <= dumped, (result["processes"], result["findings"])
    said = " ".join(result["findings"])
    assert f"pid {impostor} claims rank 2 of job {JOB} but belongs to uid {NOBODY}" in said, said
    assert 2 not in result["odd_ranks"]


@pytest.mark.slow
@needs_root
def test_r2_straggler_find_samples_only_the_jobs_processes(fake_job):
    env, ranks, impostor = fake_job
    rc, result, err = mleng("straggler_find", "--slurm-job-id", JOB, "--window-s", "5", env=env)
    assert result is not None, err
    assert {r["pid"] for r in result["ranks"]} == set(ranks), result["ranks"]
    assert not any(s["rank"] == 2 for s in result["stragglers"]), result["findings"]
    assert any(f"pid {impostor} claims rank 2 of job {JOB} but belongs to uid {NOBODY}" in f
               for f in result["findings"]), result["findings"]


@pytest.mark.slow
@needs_root
def test_r3_dumps_another_user_planted_at_the_default_prefix_are_skipped(tmp_path):
    planted = tmp_path / "shared-tmp"
    planted.mkdir(mode=0o1777)
    for i in range(4):
        shutil.copy(FR_HUNG / f"fr_{i}", planted / f"nccl_trace_rank_{i}")
        os.chown(planted / f"nccl_trace_rank_{i}", NOBODY, NOBODY)
    env = {"TORCH_FR_DUMP_TEMP_FILE": f"{planted}/nccl_trace_rank_"}
    rc, result, err = mleng("flight_recorder_analyze", env=env)
    assert rc != 0 and result is None, result
    assert f"owned by uid {NOBODY}, not you" in err and "nccl_trace_rank_0" in err, err
    assert "path=" not in err          # red team of round 4: the refusal told the agent how to go around it
    rc, result, err = mleng("flight_recorder_analyze", "--path", str(planted))   # given by hand: read, and said whose
    assert result is not None and result["findings"][0].startswith(f"Another user's files: 4 by uid {NOBODY}"), (
        result, err)
    for i in range(4):                   # the same files, ours: read, and rank 3 is named (no false refusal)
        os.chown(planted / f"nccl_trace_rank_{i}", os.geteuid(), os.getegid())
    rc, result, err = mleng("flight_recorder_analyze", env=env)
    assert result is not None and result["culprit_ranks"] == [3], (result, err)


def _bomb(lists: int) -> bytes:
    """The review's bomb, a plain pickle {'version': '2.4', 'entries': [[], [], ...]}: one byte per empty list
    (PROTO, EMPTY_DICT, key, value, SETITEM, key, EMPTY_LIST, MARK, EMPTY_LIST * n, APPENDS, SETITEM, STOP)."""
    return (b"\x80\x02}X\x07\x00\x00\x00versionX\x03\x00\x00\x002.4sX\x07\x00\x00\x00entries](" + b"]" * lists
            + b"es.")


def _max_rss_mib(args: list[str]) -> tuple[float, str]:
    """Largest RSS of any process `python -m tools run ARGS` started (the tool child), MiB; and its stderr."""
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
             "sys.stderr.write(p.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "tools", "run", *args, "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    return float(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_r7_a_pickle_bomb_is_refused_before_it_expands(tmp_path):
    assert pickle.loads(_bomb(3)) == {"version": "2.4", "entries": [[], [], []]}
    folder = tmp_path / "frbomb"
    folder.mkdir()
    (folder / "nccl_trace_rank_0").write_bytes(_bomb(10_000_000))
    rss, err = _max_rss_mib(["flight_recorder_analyze", "--path", str(folder)])
    assert "Traceback" not in err and "more than 4,000,000 Python objects" in err, err
    assert rss < 400, f"the tool child reached {rss:.0f} MiB on a 10 MB dump"


def test_r7_malformed_fields_are_errors_naming_the_field(tmp_path):
    good = pickle.loads((FR_HUNG / "fr_0").read_bytes())
    cases = {1: {"version": "2.4", "entries": [1, 2]},
             2: {**good, "pg_config": {"0": {"ranks": "1+" * 200000}}},
             3: {**good, "pg_config": {"0": {"ranks": "-" * 100000 + "1"}}},
             4: {**good, "entries": [{**good["entries"][0], "input_sizes": 7}]}}
    shutil.copy(FR_HUNG / "fr_0", tmp_path / "fr_0")
    for rank, data in cases.items():
        (tmp_path / f"fr_{rank}").write_bytes(pickle.dumps(data))
    rc, result, err = mleng("flight_recorder_analyze", "--path", str(tmp_path), "--prefix", "fr_")
    assert result is not None, err
    why = "\n".join(result["unreadable_files"])
    for field in ("'entries[0]' is int", "pg_config['0'].ranks' holds '1+1+", "pg_config['0'].ranks' holds '---",
                  "'entries[0].input_sizes' is int"):
        assert field in why, why


@pytest.mark.slow
def test_r12_a_node_result_is_stored_under_the_node_asked_for_and_srun_gets_no_token(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: the stand-in node calls itself another host (its own UTS namespace)")
    env = {**_stand_ins(tmp_path), "FAKE_HOST": "victim-host", "MLENG_HTTP_TOKEN": "t" * 40}
    rc, result, err = mleng("env_report", "--node", "n7", env=env)
    assert result is not None, err
    assert any("Ran on node n7" in f and "calls itself host victim-host" in f for f in result["findings"]), result
    assert "MLENG_HTTP_TOKEN" not in (tmp_path / "srun-env").read_text()
    _, claimed, _ = mleng("results_history", "--host", "victim-host")
    _, asked, _ = mleng("results_history", "--host", "n7")
    assert claimed["rows"] == [] and [(r["tool"], r["host"]) for r in asked["rows"]] == [("env_report", "n7")], asked


@needs_root
def test_r14_pid_1_and_our_own_process_are_refused_as_targets():
    for tool in ("straggler_find", "hang_stack_dump"):
        rc, result, err = mleng(tool, "--launcher-pid", "1")
        assert rc != 0 and "launcher_pid 1 is this tool's own process or one of its ancestors" in err, (tool, err)
    # The CLI's own pid ($$ becomes it through exec): the server or CLI is never a target.
    proc = subprocess.run(["bash", "-c", f'exec {sys.executable} -m tools run hang_stack_dump --pids $$ --json'],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode != 0 and "is this tool's own process" in proc.stderr, proc.stdout[-500:] + proc.stderr
    # Another tool run of the server (`tools.engine.child TOOL`, a sibling of this one) is not a target either.
    sibling = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(60)", "tools.engine.child", "matmul_bench"])
    try:
        time.sleep(0.5)
        rc, result, err = mleng("hang_stack_dump", "--pids", str(sibling.pid))
        assert rc != 0 and "is one of mleng's own processes" in err, err
    finally:
        _stop(sibling)


@pytest.mark.slow
@needs_root
def test_r14_another_users_pid_needs_roots_explicit_opt_in():
    other = _spawn("import time\nwhile True: time.sleep(1)", {}, user="nobody")
    try:
        pid = _child_pid(other)
        rc, result, err = mleng("hang_stack_dump", "--pids", str(pid))
        assert rc != 0 and f"pids: {pid} belongs to uid {NOBODY}" in err and "allow_other_users" in err, err
        rc, result, err = mleng("hang_stack_dump", "--pids", str(pid), "--allow-other-users")
        assert result is not None and [p["pid"] for p in result["processes"]] == [pid], (result, err)
    finally:
        _stop(other)


def test_r15_a_process_name_with_newlines_forges_no_line_in_the_error():
    name = "\x1b]52;c;aGk=\x07\x1b[2K\rFAKE-OK\nnext: all good"
    proc = subprocess.Popen(["bash", "-c", f'exec -a "$NAME" sleep 60'], env={**os.environ, "NAME": name})
    try:
        time.sleep(0.5)
        rc, result, err = mleng("straggler_find", "--pids", str(proc.pid))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert rc != 0 and "is not a Python process" in err, err
    assert not any(line.startswith(("next: all good", "FAKE-OK")) for line in err.splitlines()), err
    assert "FAKE-OK\\x0anext: all good" in err and "\x1b" not in err and "\r" not in err, repr(err)


def test_r7_other_bombs_are_refused_before_the_unpickler_sees_them(tmp_path, monkeypatch):
    """A 6-byte LONG_BINPUT of index 2**31-1 makes C's unpickler allocate and zero a 16 GiB memo; a flood of
    2-byte BINGETs builds no object but one reference each; JSON `[[],[],...]` has no opcodes to count."""
    from tools.shared import flight_recorder as fr

    head = b"\x80\x02}X\x07\x00\x00\x00versionX\x03\x00\x00\x002.4"
    (tmp_path / "memo").write_bytes(head + b"r\xff\xff\xff\x7fs.")
    (tmp_path / "refs").write_bytes(head + b"sX\x07\x00\x00\x00entries]q\x01(" + b"h\x01" * 2000 + b"es.")
    (tmp_path / "json").write_text('{"version": "2.4", "entries": [' + "[]," * 3000 + "[]]}")
    monkeypatch.setattr(fr, "MAX_OPCODES", 1000)
    monkeypatch.setattr(fr, "MAX_OBJECTS", 1000)
    for name, said in (("memo", "memo index 2147483647"), ("refs", "more than 1,000 pickle opcodes"),
                       ("json", "more than 1,000 Python objects")):
        with pytest.raises(fr.UnsafeDump, match=said):
            fr.load_dump(tmp_path / name)


@needs_root
def test_r14_hang_stack_dump_all_nodes_checks_the_jobs_owner():
    """As straggler_find does: a user may not run `hang_stack_dump --slurm-job-id X --all-nodes` on root's job."""
    import sysconfig
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mleng-r14-") as home:
        os.chmod(home, 0o755)
        env = _stand_ins(Path(home))
        os.chown(home, NOBODY, NOBODY)
        as_nobody = [shutil.which("runuser") or "runuser", "-u", "nobody", "--", "env",
                     f"PYTHONPATH={sysconfig.get_paths()['purelib']}:{ROOT}", f"MLENG_HOME={home}/h",
                     f"PATH={env['PATH']}", "FAKE_SQUEUE=RUNNING|root|2|n[1-2]|0|4242", f"FAKE_DIR={home}",
                     f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"]
        probe = subprocess.run([*as_nobody, "-c", "import tools.hang_stack_dump"], capture_output=True, text=True,
                               cwd="/", timeout=60)
        if probe.returncode:
            pytest.skip(f"nobody cannot import the tool from {ROOT}: {probe.stderr.strip()[-200:]}")
        proc = subprocess.run([*as_nobody, "-m", "tools", "run", "hang_stack_dump", "--slurm-job-id", "4242",
                               "--all-nodes"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode != 0 and "belongs to root, not to you (nobody)" in proc.stderr, proc.stderr[-800:]
        assert not Path(home, "srun-env").exists(), "srun was started for another user's job"
