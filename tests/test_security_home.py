"""Security review 2026-12-02, the home and the drills (R1, R4, R11, R13, R17), through the real CLI and server.

"Another user" is `nobody` (uid 65534): as root, a file or link is handed to nobody with (l)chown, as if
nobody had made it. Those tests skip where this is not root.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="hands files to another user (nobody) with chown: needs root")


def mleng(home: Path, *args: str, stdin: str | None = None, timeout: float = 120, env: dict | None = None):
    env = {**os.environ, "MLENG_HOME": str(home), **(env or {})}
    env.pop("MLENG_HTTP_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "tools", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def nobodys(path: Path) -> Path:
    os.lchown(path, NOBODY, NOBODY)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(home: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "MLENG_HOME": str(home)}
    env.pop("MLENG_HTTP_TOKEN", None)
    return subprocess.Popen([sys.executable, "server.py", "--http", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


# --- R1: a home, a token file, a lock or a drill folder another user made ----------------------------

@as_root
def test_r1_a_home_another_user_made_is_refused_and_gets_no_token(tmp_path):
    home = tmp_path / "H"
    home.mkdir()
    os.chmod(nobodys(home), 0o777)
    port = _free_port()
    planted = home / f"http-{port}.token"
    planted.touch()
    os.chmod(nobodys(planted), 0o666)
    server = _serve(home, port)
    try:
        _, err = server.communicate(timeout=90)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode != 0
    assert planted.read_text() == "", "the token went into nobody's file"
    assert f"{home} is owned by another user (owner uid {NOBODY}" in err and "set MLENG_HOME to a folder you own" in err
    assert "Traceback" not in err


@as_root
def test_r1_a_home_inside_another_users_folder_is_refused(tmp_path):
    """nobody owns the folder the home is in: nobody could rename our home away and put theirs in its place."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    nobodys(theirs)
    out = mleng(theirs / "home", "drill", "stop")
    assert out.returncode == 2 and f"{theirs} is the home's folder" in out.stderr and f"owner uid {NOBODY}" in out.stderr


@as_root
def test_r1_a_planted_lock_link_is_refused_and_creates_nothing(tmp_path):
    home = tmp_path / "home"
    lock_dir = home / "locks" / socket.gethostname()
    lock_dir.mkdir(parents=True)
    victim_dir = tmp_path / "root_only"
    victim_dir.mkdir(mode=0o700)
    (lock_dir / "gpu0.lock").symlink_to(victim_dir / "created_by_root")
    nobodys(lock_dir / "gpu0.lock")
    out = mleng(home, "run", "matmul_bench", "--device", "0")
    assert not (victim_dir / "created_by_root").exists(), "the lock's open followed nobody's link"
    assert out.returncode != 0 and "gpu0.lock is a symbolic link" in out.stderr and "Traceback" not in out.stderr


@as_root
def test_r1_a_planted_drill_link_is_refused_and_nothing_is_chmodded(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    victim = tmp_path / "chmodvictim"
    victim.mkdir(mode=0o755)
    os.chmod(victim, 0o755)
    (home / "drill").symlink_to(victim)
    nobodys(home / "drill")
    out = mleng(home, "drill", "start", "pm-clean-log")
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755, "start chmodded the link's target"
    assert out.returncode == 2 and "drill is a symbolic link" in out.stderr
    assert list(victim.iterdir()) == []


@as_root
def test_r1_a_token_file_in_our_home_is_replaced_never_written_into(tmp_path):
    """Our home was 0777 for a while, and nobody left a 0666 token file in it: the token goes into a file
    the server just made (nobody's open descriptor on the old one reads nothing)."""
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    port = _free_port()
    planted = home / f"http-{port}.token"
    planted.touch()
    os.chmod(nobodys(planted), 0o666)
    with open(planted) as nobodys_view:
        server = _serve(home, port)
        try:
            assert _wait_for(lambda: os.stat(planted).st_uid == 0, 90), "no token file of ours appeared"
            assert nobodys_view.read() == ""
            info = os.stat(planted)
            assert stat.S_IMODE(info.st_mode) == 0o600 and len(planted.read_text().strip()) >= 32
            assert stat.S_IMODE(home.stat().st_mode) == 0o700
        finally:
            server.terminate()
            server.wait(20)


# --- R13: a second server on a busy port --------------------------------------------------------------

def test_r13_a_second_server_on_a_busy_port_says_so_and_leaves_the_first_ones_token(tmp_path):
    home = tmp_path / "home"
    port = _free_port()
    token_file = home / f"http-{port}.token"
    first = _serve(home, port)
    try:
        assert _wait_for(token_file.exists, 90), "the first server never wrote its token"
        token = token_file.read_text()
        second = _serve(home, port)
        _, err = second.communicate(timeout=90)
        assert second.returncode != 0 and f"127.0.0.1:{port} is taken" in err and "Traceback" not in err
        assert token_file.read_text() == token, "the second server touched the first one's token file"
    finally:
        first.terminate()
        first.wait(20)
    assert _wait_for(lambda: not token_file.exists(), 5), "the first server left its token file at exit"


# --- R4: stop undoes only what start did ---------------------------------------------------------------

@pytest.fixture
def victims(tmp_path):
    """Two processes that are not the drill's (one leads its own group) and a folder that is not the drill's."""
    procs = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
    victim = tmp_path / "victimdir"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    yield procs, victim
    for p in procs:
        p.kill()
        p.wait()


def _fake_scancel(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scancel", "squeue"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/slurm.log\n')
        script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _alive(procs) -> bool:
    return all(p.poll() is None and not Path(f"/proc/{p.pid}/status").read_text().count("State:\tT") for p in procs)


def _plant_state(home: Path, state: dict) -> Path:
    drill = home / "drill"
    drill.mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    path = drill / "state.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, json.dumps(state).encode())
    os.close(fd)
    return path


def test_r4_the_reviews_crafted_state_is_refused_and_nothing_is_done(tmp_path, victims):
    procs, victim = victims
    home = tmp_path / "home"
    s1, s2 = (p.pid for p in procs)
    _plant_state(home, {"scenario": "pm-clean-log", "holder_pid": s1, "work_dir": str(victim),
                        "steps": [{"kind": "gpu_cotenant", "pid": s2},
                                  {"kind": "training_job", "job_id": "--user=alice", "frozen_pids": [s1]}]})
    out = mleng(home, "drill", "stop", env=_fake_scancel(tmp_path))
    assert out.returncode == 2 and "is not a state `mleng drill start` wrote" in out.stderr, out.stderr
    assert (victim / "keep").read_text() == "mine" and _alive(procs)
    assert not (tmp_path / "slurm.log").exists(), (tmp_path / "slurm.log").read_text()


@pytest.mark.parametrize("change, complaint", [
    ({"work_dir": "VICTIM"}, "work_dir must be the drill's own folder"),
    ({"steps": [{"fault": {"kind": "training_job"}, "job_id": "--user=alice"}]}, "steps.0.job_id"),
    ({"steps": [{"fault": {"kind": "cpu_limit", "node": "../x", "percent": 5}}]}, "is not one of the namespace"),
    ({"steps": [{"fault": {"kind": "gpu_cotenant"}, "pid": {"pid": 1, "start_ticks": 0}}]}, "steps.0.pid.pid"),
    ({"steps": [{"fault": {"kind": "rm_rf"}}]}, "steps.0.fault"),
])
def test_r4_a_state_in_our_format_that_start_could_not_have_written_is_refused(tmp_path, victims, change, complaint):
    procs, victim = victims
    home = tmp_path / "home"
    state = {"scenario": "pm-clean-log", "work_dir": str(home / "drill" / "work"), **change}
    state["work_dir"] = state["work_dir"].replace("VICTIM", str(victim))
    _plant_state(home, state)
    out = mleng(home, "drill", "stop", env=_fake_scancel(tmp_path))
    assert out.returncode == 2 and complaint in out.stderr and "nothing was undone" in out.stderr, out.stderr
    assert (victim / "keep").exists() and _alive(procs) and not (tmp_path / "slurm.log").exists()


def test_r4_stop_signals_only_the_processes_the_drill_started(tmp_path, victims):
    """Pids that are not (or no longer) the recorded processes: their start time differs, so nothing is sent."""
    procs, _ = victims
    home = tmp_path / "home"
    s1, s2 = (p.pid for p in procs)
    _plant_state(home, {"scenario": "pm-clean-log", "work_dir": str(home / "drill" / "work"),
                        "holder": {"pid": s1, "start_ticks": 1},
                        "steps": [{"fault": {"kind": "gpu_cotenant"}, "pid": {"pid": s2, "start_ticks": 1}}]})
    out = mleng(home, "drill", "stop")
    assert out.returncode == 0 and "drill stopped" in out.stdout, out.stderr
    assert _alive(procs)


@as_root
def test_r4_a_state_file_another_user_wrote_is_refused(tmp_path, victims):
    procs, victim = victims
    home = tmp_path / "home"
    path = _plant_state(home, {"scenario": "pm-clean-log", "work_dir": str(home / "drill" / "work")})
    nobodys(path)
    out = mleng(home, "drill", "stop")
    assert out.returncode == 2 and f"owner uid {NOBODY}" in out.stderr and "Traceback" not in out.stderr


# --- R17: every fault is recorded before it takes effect ----------------------------------------------

def test_r17_a_helper_killed_before_its_stamp_is_saved_never_starts(tmp_path):
    """The CLI dies (os._exit, as under kill -9) while recording the helper's stamp: the helper, in a session
    of its own, sees its pipe close and exits without running a line of its code."""
    marker = tmp_path / "ran"
    code = ("from tools.evals.drills.stamps import start_detached\n"
            f"start_detached(\"open({str(marker)!r}, 'w').close(); print('busy', flush=True)\\n"
            "import time; time.sleep(300)\", lambda stamp: (print(stamp.pid, flush=True), __import__('os')._exit(9)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 9, out.stderr
    helper = int(out.stdout.split()[0])
    assert _wait_for(lambda: not Path(f"/proc/{helper}").exists() or
                     "State:\tZ" in Path(f"/proc/{helper}/status").read_text(), 10), "the helper lives on"
    assert not marker.exists(), "the helper ran before its stamp was saved"


def test_r17_a_frozen_slurmd_is_recorded_before_it_stops_and_resumed_by_stop(tmp_path, monkeypatch):
    from tools.evals.drills import faults, session
    from tools.evals.drills.scenarios import FreezeSlurmd, load_scenario
    from tools.evals.drills.state import DrillState, state_file, work_dir

    monkeypatch.setenv("MLENG_HOME", str(tmp_path / "home"))
    slurmd = subprocess.Popen(["sleep", "300"])
    monkeypatch.setattr(faults, "slurmd_pid", lambda node: slurmd.pid)
    real_kill, seen = os.kill, []

    def kill(pid, sig):
        if sig == signal.SIGSTOP:
            seen.append(json.loads(state_file().read_text())["steps"][-1]["pid"]["pid"])
        real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    try:
        state = DrillState(scenario="cl-dead-slurmd", work_dir=str(work_dir()), started_cluster=True)
        faults.apply(FreezeSlurmd(kind="freeze_slurmd", node="mln2"), state, load_scenario("cl-dead-slurmd"))
        assert seen == [slurmd.pid], "SIGSTOP went out before the pid was in the state file"
        stopped = lambda: "State:\tT" in Path(f"/proc/{slurmd.pid}/status").read_text()  # noqa: E731
        assert _wait_for(stopped, 5), "slurmd was not stopped"         # a signal lands asynchronously
        monkeypatch.setattr(session, "cluster_script", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
        assert session.stop() == []
        assert _wait_for(lambda: not stopped(), 5), "stop left slurmd stopped"
    finally:
        slurmd.kill()
        slurmd.wait()


# --- R11: drill grade reads through safe_read and sees drains in the action ---------------------------

def test_r11_a_fifo_a_device_or_deep_nesting_is_a_clear_error(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for source, stdin, complaint in ((str(fifo), None, "FIFO"), ("/dev/zero", None, "character device"),
                                     ("-", "[" * 200_000, "nests too deeply")):
        t0 = time.monotonic()
        out = mleng(tmp_path / "home", "drill", "grade", "pm-clean-log", "--diagnosis", source, stdin=stdin, timeout=30)
        assert out.returncode == 2 and complaint in out.stderr and "Traceback" not in out.stderr, out.stderr[-500:]
        assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("scenario, diagnosis, score", [
    ("cl-healthy-allreduce", {"culprit_kind": "none", "drain": [],
                              "action": "scontrol update nodename=mln[1-4] state=drain"}, 0),
    ("cl-slow-node", {"culprit_kind": "node", "culprit": ["mln3"], "drain": ["mln3"],
                      "action": "drain mln1 mln2 mln3 mln4 and rerun"}, 0),
    ("cl-slow-node", {"culprit_kind": "node", "culprit": ["mln3"], "drain": [],
                      "commands": ["sinfo", "scontrol update nodename=mln1 state=down"]}, 0),
    ("cl-slow-node", {"culprit_kind": "node", "culprit": ["mln3"], "drain": ["mln3"],
                      "action": "don't drain mln1, drain mln2 and mln3"}, 0),
    ("cl-healthy-allreduce", {"culprit_kind": "none", "action": "drain mln1, no need to rerun"}, 0),
    # the healthy side: a drain the truth allows, and a negated one, are not false drains
    ("cl-slow-node", {"culprit_kind": "node", "culprit": ["mln3"], "drain": ["mln3"],
                      "action": "drain mln3; do not drain mln1 or mln2, they are fine"}, 1),
    ("cl-healthy-allreduce", {"culprit_kind": "none", "action": "nothing to drain; rerun on mln1-mln4"}, 1),
])
def test_r11_a_drain_written_in_the_action_counts_as_a_drain(tmp_path, scenario, diagnosis, score):
    out = mleng(tmp_path / "home", "drill", "grade", scenario, "--diagnosis", "-", "--json", stdin=json.dumps(diagnosis))
    assert out.returncode == 0, out.stderr
    graded = json.loads(out.stdout)
    assert graded["score"] == score, graded
    assert bool(graded["false_drain"]) == (score == 0)


def test_a_hard_link_in_the_home_to_one_of_our_files_is_not_opened_nor_chmodded(tmp_path, monkeypatch):
    """Red team of this change: a second name for a file of ours (e.g. made while the home was still open
    to others) would have had its mode set to 0600 through the lock's descriptor."""
    from tools.engine.home import UnsafeHome, open_lock, private_dir

    monkeypatch.setenv("MLENG_HOME", str(tmp_path / "home"))
    elsewhere = tmp_path / "config"
    elsewhere.write_text("x")
    elsewhere.chmod(0o644)
    lock = private_dir("locks") / "gpu0.lock"
    os.link(elsewhere, lock)
    with pytest.raises(UnsafeHome, match="a hard link"):
        open_lock(lock)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o644
