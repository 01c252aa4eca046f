"""launch_script: hostile values never become shell code, and every generated script is one the real
SLURM accepts (`sbatch --test-only` on the local cluster of tests/slurm_cluster.py).

The hostile-input tests run the generated sbatch script for real, under stub `srun` and `scontrol`
(bash scripts on PATH that play one job of two nodes), with a fake interpreter that records the argv
it got: every shell expansion a hostile value carries would create a marker file; none may appear.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the fixture)
from tools import launch_script
from tools.launch_script import render

P = launch_script.LaunchScriptParams


def noop(fraction, message):
    pass


def script_for(**kw) -> str:
    return launch_script.run(P(**{"pass_nccl_env": False, **kw}), noop).script


@pytest.mark.parametrize("field, value", [
    ("command", "train.py\nrm -rf ~"), ("command", "train.py\r--x"), ("command", "a\x00b"), ("command", "a\x1b[2Jb"),
    ("python", "/usr/bin/python3\ntouch x"), ("workdir", "/tmp\ntouch x"), ("script_path", "/tmp/a\tb"),
    ("log_dir", "logs\ntouch x"), ("log_dir", "$(touch pwned)"), ("log_dir", "my logs"), ("log_dir", "`id`"),
    ("extra_sbatch", ["--qos=high\ntouch x"]), ("extra_sbatch", ["touch x"]), ("tool_args", ["--x\ny"]),
    ("env", {"A": "1\ntouch x"}), ("env", {"A;touch x": "1"}), ("job_name", "a$(id)"), ("partition", "gpu;id"),
])
def test_control_characters_and_shell_syntax_refused_where_no_shell_unquotes(field, value):
    base = {"tool": "dist_smoke_test"} if field == "tool_args" else {"command": "train.py"}
    with pytest.raises(ValidationError, match=field if field != "env" else "env|variable names"):
        P(**{**base, field: value})


@pytest.mark.parametrize("command", ["train.py --name 'unclosed", 'train.py "half', "train.py \\"])
def test_bad_quoting_in_command_is_a_clear_error(command):
    with pytest.raises(ValidationError, match="command: .*close every quote"):
        P(command=command)


STUB_SRUN = """#!/bin/bash
# Plays srun for a 2-node job: records its options, then runs `bash -c PAYLOAD` once per task.
printf '%s\\n' "$@" > "$STUB_DIR/srun-args"
while [ "$#" -gt 0 ] && [ "$1" != bash ]; do shift; done
shift 2
for i in 0 1; do SLURM_PROCID=$i bash -c "$1" || exit $?; done
"""
STUB_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") printf 'n1\\nn2\\n' ;;
  "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=10.9.9.1 NodeHostName=$3" ;;
esac
"""
RECORDER = """import json, os, sys
with open(os.path.join(os.environ["STUB_DIR"], "argv-%s.json" % os.environ["SLURM_PROCID"]), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": os.environ.get("HOSTILE", "")}, f)
"""


def _stubs(root: Path) -> tuple[Path, str]:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    py_dir = root / "my interpreter $(touch pwned-python)"
    py_dir.mkdir()
    recorder = py_dir / "py"
    recorder.write_text(f"#!{sys.executable}\n{RECORDER}")
    recorder.chmod(0o755)
    return bin_dir, str(recorder)


HOSTILE_ARGS = ["--name", "$(touch pwned-cmd1)", "--tag", "`touch pwned-cmd2`", "--x", "a;touch pwned-cmd3",
                "--y", "'quoted' \"twice\" & touch pwned-cmd4 |", "--z", "${IFS}$(touch${IFS}pwned-cmd5)"]


def test_hostile_values_stay_data_when_the_script_runs(tmp_path):
    bin_dir, recorder = _stubs(tmp_path)
    workdir = tmp_path / "work dir $(touch pwned-workdir) `touch pwned-wd2`"
    workdir.mkdir()
    p = P(command="train.py " + shlex.join(HOSTILE_ARGS), nnodes=2, gpus_per_node=0, nproc_per_node=1,
          python=recorder, workdir=str(workdir), log_dir="logs/%x+run", pass_nccl_env=False,
          env={"HOSTILE": "$(touch pwned-env) `touch pwned-env2` ;touch pwned-env3"})
    script = launch_script.run(p, noop).script
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NAME": "mleng", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_ON_NODE": "6", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pwned = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("pwned*") if f.is_file())
    assert pwned == [], f"shell code ran from a value: {pwned}"
    for task in (0, 1):
        seen = json.loads((tmp_path / f"argv-{task}.json").read_text())
        assert seen["argv"][-len(HOSTILE_ARGS) - 1:] == ["train.py", *HOSTILE_ARGS]
        assert seen["env"] == "$(touch pwned-env) `touch pwned-env2` ;touch pwned-env3"
        assert f"--rdzv-endpoint=10.9.9.1:{20000 + 4242 % 20000}" in seen["argv"]  # port from the job id
        assert f"--rdzv-conf=is_host={int(task == 0)}" in seen["argv"]
        assert f"--log-dir=logs/%x+run/4242/node{task}" in seen["argv"]
    srun_args = (tmp_path / "srun-args").read_text().splitlines()
    assert "--cpus-per-task=6" in srun_args and "--output=logs/%x+run/%x-%j-node%t.out" in srun_args
    assert (workdir / "logs" / "%x+run").is_dir()


def test_defaults_for_cpus_exclusive_port_and_python():
    script = script_for(command="train.py", nnodes=2)
    assert "#SBATCH --exclusive" in script and "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}" in script
    assert "MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[-1].startswith("python3 -m torch.distributed.run")  # the nodes' python3, not mleng's
    pinned = script_for(command="train.py", cpus_per_task=16, exclusive=False, rdzv_port=29555, python="/opt/py/bin/python")
    assert "#SBATCH --cpus-per-task=16" in pinned and "--exclusive" not in pinned and "MASTER_PORT=29555" in pinned
    assert "/opt/py/bin/python -m torch.distributed.run" in pinned
    r = launch_script.run(P(command="train.py", exclusive=False, pass_nccl_env=False), noop)
    assert any("cpus_per_task" in f for f in r.findings)
    srun_mode = launch_script.run(P(command="train.py", mode="srun", pass_nccl_env=False), noop).commands[0]
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"' in srun_mode


def test_repeated_extra_sbatch_values_from_the_command_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tools.launch_script", "--command", "train.py",
                          "--extra-sbatch=--qos=high", "--extra-sbatch=--constraint=h100", "--json"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert out.returncode == 0, out.stderr
    script = json.loads(out.stdout)["script"]
    assert "#SBATCH --qos=high" in script and "#SBATCH --constraint=h100" in script


SBATCH_CASES = {
    "command-defaults": dict(command="train.py --lr 3e-4"),
    "gres-cpus-shared": dict(command="train.py", gpu_option="gres", gpus_per_node=1, partition="gpu",
                             cpus_per_task=2, exclusive=False),
    "gpus-per-node": dict(command="-m pkg.train", gpus_per_node=1, partition="gpu", nproc_per_node=1),
    "extra-sbatch": dict(command="train.py", gpus_per_node=0, extra_sbatch=["--comment=mleng", "--requeue"]),
    "tool": dict(tool="dist_smoke_test", tool_args=["--backend", "gloo"], gpus_per_node=0),
    "one-node": dict(command="train.py", nnodes=1, gpus_per_node=0, time_limit="1-00:00:00"),
}


@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(SBATCH_CASES))
def test_real_sbatch_accepts_every_generated_script(slurm_cluster, tmp_path, case):  # noqa: F811
    kw = {"gpus_per_node": 0, **SBATCH_CASES[case], "workdir": str(tmp_path), "job_name": f"t-{case}",
          "pass_nccl_env": False, "nnodes": SBATCH_CASES[case].get("nnodes", 2)}
    r = launch_script.run(P(**kw, script_path=str(tmp_path / "job.sbatch")), noop)
    out = subprocess.run(["sbatch", "--test-only", r.script_path], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env={**os.environ, "SLURM_CONF": slurm_cluster.conf})
    assert out.returncode == 0 and "to start at" in out.stderr, (out.stderr, r.script)


def _first_node_lines(script: str) -> str:
    """The generated lines that find the first node and MASTER_ADDR, as the script runs them."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("head_node="))
    end = next(i for i, line in enumerate(lines) if line.startswith("export MASTER_ADDR="))
    return "\n".join(lines[start:end + 1])


def test_the_first_node_lookup_survives_pipefail_with_a_thousand_nodes(tmp_path):
    """`scontrol show hostnames ... | head -n 1` under `set -euo pipefail`: head exits after one line, a
    scontrol still writing gets SIGPIPE, and the job dies with 141 before training (10 of 20 runs with
    1000 names, issue 23). Every generated lookup must read the whole list."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/bash\n"
        'if [ "$2" = hostnames ]; then for i in $(seq -w 1 1000); do echo "gpu-node-$i"; done\n'   # a write per name
        'else echo "NodeName=$3 Arch=x86_64 NodeAddr=10.1.0.1 NodeHostName=$3"; fi\n')
    (bin_dir / "scontrol").chmod(0o755)
    lookup = _first_node_lines(script_for(command="train.py", nnodes=1000))
    srun_line = launch_script.run(P(command="train.py", nnodes=1000, mode="srun", pass_nccl_env=False), noop).commands[0]
    inner = shlex.split(srun_line)[-1]     # what each task's bash -c runs
    first_node = render.FIRST_NODE
    assert f"--rdzv-endpoint={first_node}:" in inner
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-node-[0001-1000]", "SLURM_JOB_ID": "7"}
    assert "| head" not in lookup + inner
    for _ in range(20):
        done = subprocess.run(["bash", "-c", f"set -euo pipefail\n{lookup}\necho \"$MASTER_ADDR\""], env=env,
                              capture_output=True, text=True, timeout=30)
        assert (done.returncode, done.stdout.strip()) == (0, "10.1.0.1"), done.stderr
        first = subprocess.run(["bash", "-c", f"set -euo pipefail\necho {first_node}"],
                               env=env, capture_output=True, text=True, timeout=30)
        assert (first.returncode, first.stdout.strip()) == (0, "gpu-node-0001"), first.stderr


def test_every_template_names_no_early_exit_reader_after_a_pipe():
    """The scan of issue 23: no generated script or documented launcher pipes into `head`."""
    import re

    root = Path(__file__).resolve().parent.parent
    texts = {p: p.read_text() for p in [*root.glob("tools/launch_script/*.py"), *root.glob("knowledge/orchestration/*.md")]}
    offenders = [str(p) for p, text in texts.items() if re.search(r"scontrol show hostnames[^\n|]*\|\s*head\b", text)]
    assert not offenders
