"""The `mleng` command line and `python -m tools.<name>`: the same registry, human and JSON output."""

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env_home):
    env = {**os.environ, "MLENG_HOME": str(env_home)}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_list_shows_every_registered_tool(mleng_home):
    from tools.engine.registry import registry

    out = run("-m", "tools", "list", env_home=mleng_home)
    assert out.returncode == 0
    listed = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
    assert listed == set(registry())


def test_run_json_and_human_output(mleng_home):
    out = run("-m", "tools", "run", "accelerator_specs", "--names", "h100", "mi300x", "--json", env_home=mleng_home)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [a["id"] for a in data["accelerators"]] == ["h100-sxm", "mi300x"]
    human = run("-m", "tools.accelerator_specs", "--names", "b200", env_home=mleng_home)
    assert human.returncode == 0 and human.stdout.startswith("accelerator_specs: INFO")


def test_bad_argument_names_the_flag(mleng_home):
    out = run("-m", "tools", "run", "knowledge_search", "--query", "nccl", "--k", "0", env_home=mleng_home)
    assert out.returncode == 2 and "--k" in out.stderr and "greater than or equal to 1" in out.stderr
    out = run("-m", "tools", "run", "no_such_tool", env_home=mleng_home)
    assert out.returncode == 2 and "unknown tool 'no_such_tool'" in out.stderr


def test_subprocess_tool_from_cli_stores_its_result(mleng_home):
    out = run("-m", "tools", "run", "gpu_health", "--json", env_home=mleng_home)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result_id"] >= 1
    hist = run("-m", "tools", "run", "results_history", "--tool", "gpu_health", "--json", env_home=mleng_home)
    assert json.loads(hist.stdout)["total_matching"] == 1


@pytest.fixture(scope="module")
def doctor_screen(tmp_path_factory):
    """One real `doctor` run (its checks are ~9 CPU-s: a server start, torchrun with two ranks, env_report's
    torch), read by the tests below: what it prints for a person holds every row the JSON has."""
    out = run("-m", "tools", "doctor", env_home=tmp_path_factory.mktemp("doctor-home"))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# One worker under `-n 2 --dist loadgroup`: split across two, each would run doctor once.
@pytest.mark.slow
@pytest.mark.xdist_group("doctor")
def test_doctor_summarises_this_machine(doctor_screen):
    assert "mleng doctor on" in doctor_screen and "env_report" in doctor_screen and "gpu_health" in doctor_screen
    assert "Overall:" in doctor_screen


@pytest.mark.slow
@pytest.mark.xdist_group("doctor")
def test_doctor_checks_the_server_runs_the_smoke_test_and_says_what_it_skipped(doctor_screen):
    """The same checks as `doctor --json` reports them (test_wheel.py reads that form from the wheel)."""
    from tools.engine.processes import local_gpu_count
    from tools.engine.registry import registry

    rows = {m.group(2): (m.group(1), m.group(3)) for m in re.finditer(
        r"^  (OK|INFO|WARN|FAIL) +(mcp server \(stdio\)|[a-z0-9_]+) +[\d.]+s  (.*)$", doctor_screen, re.M)}
    assert rows["mcp server (stdio)"] == ("OK", f"answers tools/list with {len(registry())} tools")
    assert rows["dist_smoke_test"][0] == "OK", rows["dist_smoke_test"]
    skipped = re.search(r"^  Skipped here \([^)]*\): (.*)$", doctor_screen, re.M).group(1).split(", ")
    hooked = {n for n, s in registry().items() if s.doctor}
    assert set(rows) | set(skipped) == hooked | {"mcp server (stdio)"}
    if local_gpu_count() == 0:
        assert "matmul_bench" in skipped   # a CPU machine says so instead of "nothing to check"


def test_readme_tool_table_is_the_one_the_registry_renders(mleng_home):
    """README's table is `mleng list --markdown` (name, summary, where it runs): no tool missing, none stale."""
    from tools.engine.cli import tool_table
    from tools.engine.registry import registry

    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    block = readme.split("<!-- mleng list --markdown -->\n", 1)[1].split("<!-- /mleng list -->", 1)[0]
    assert block == tool_table(registry().values()), "README's tool table is stale: paste `mleng list --markdown`"
    out = run("-m", "tools", "list", "--markdown", env_home=mleng_home)
    assert out.returncode == 0 and out.stdout == block
    assert set(registry()) == set(re.findall(r"^\| `([a-z0-9_]+)` \|", block, re.M))
    in_process = {n for n, s in registry().items() if s.runs == "in_process"}
    assert in_process == set(re.findall(r"^\| `([a-z0-9_]+)` \|.*\| in-process \|$", block, re.M))


def test_every_tool_has_a_command_line_and_no_field_takes_an_execution_options_name():
    # job_status's own wait_s once met the CLI's --wait-s: argparse refused job_status's whole command line.
    import fault_tools
    from tools.engine.cli import tool_parser
    from tools.engine.registry import registry
    from tools.engine.spec import Field, Params, ToolSpec

    for spec in registry().values():
        flags = tool_parser(spec, f"mleng run {spec.name}")._option_string_actions
        assert {"--timeout-s", "--wait-s"} <= set(flags), spec.name
    assert tool_parser(registry()["job_status"], "x").parse_args(["--wait-s", "5"]).wait_s == "5"   # its own field

    class Waits(Params):
        wait_s: float = Field(0, description="a subprocess tool's field named like the call's option")

    with pytest.raises(ValueError, match="execution options"):
        ToolSpec(name="clash", summary="s", description="d", Params=Waits, Result=fault_tools.FaultResult,
                 run=lambda p, progress: None, runs="subprocess")
