"""The wheel works outside the checkout: built with `pip wheel .`, installed into a fresh environment,
run from a directory that is not the checkout.

The fresh environment gets mleng from the wheel only. Its dependencies (mcp, pydantic, torch, ...) are
borrowed from the test's own environment through a `.pth` line that adds that site-packages as a
plain path: a `.pth` file inside it (the editable install of this checkout) is not executed, so
`mleng` cannot come from the checkout, and nothing is downloaded.
"""

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# One worker under `-n 2 --dist loadgroup`: split across two, each built and installed the wheel (~40 s).
pytestmark = [pytest.mark.xdist_group("wheel"), pytest.mark.slow]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"   # build from a copy: setuptools leaves build/ and *.egg-info where it builds
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info",
                                                                 "__pycache__", ".mleng-home", ".whl"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-w", str(work / "dist"), "-q"], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next((work / "dist").glob("mleng-*.whl"))
    env = work / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    outside = work / "elsewhere"
    (outside / "tools").mkdir(parents=True)          # a user's own `tools` package must not shadow ours
    (outside / "tools" / "__init__.py").write_text("raise ImportError('the user tools package was imported')\n")
    return {"wheel": wheel, "python": python, "bin": env / "bin", "cwd": outside,
            "env": {"PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(work), "MLENG_HOME": str(work / "home")}}


def _run(installed, *argv, timeout=300):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=installed["cwd"],
                          env=installed["env"])


def test_the_wheel_ships_one_top_level_name_and_its_data(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"mleng"}, f"top-level names in the wheel: {sorted(top)}"
    assert "mleng/knowledge/data/accelerators.toml" in names
    assert "mleng/eval_cases/cases.jsonl" in names
    assert "mleng/eval_cases/scenarios/cl-slow-node.toml" in names          # the drills and their fixtures
    assert "mleng/eval_cases/scenarios/fixtures/fr_hung/fr_3" in names
    assert "mleng/skill/SKILL.md" in names
    assert sum(n.startswith("mleng/knowledge/") and n.endswith(".md") for n in names) >= 40


def test_installed_package_is_the_wheel_not_the_checkout(installed):
    out = _run(installed, str(installed["python"]), "-c",
               "import mleng.engine.data as d; print(d.PACKAGE_DIR); print(d.KNOWLEDGE_DIR)")
    assert out.returncode == 0, out.stderr
    package_dir, knowledge = out.stdout.split()
    assert str(ROOT) not in package_dir and package_dir.endswith("site-packages/mleng")
    assert knowledge == f"{package_dir}/knowledge"
    gone = _run(installed, str(installed["python"]), "-c", "import server")
    assert gone.returncode != 0, "the wheel must not install a top-level `server` module"


def test_mleng_doctor_runs_from_the_wheel(installed):
    out = _run(installed, str(installed["bin"] / "mleng"), "doctor", "--json", timeout=600)
    assert out.returncode in (0, 3), out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert "env_report" in report["results"] and "accelerator_specs" not in report.get("errors", {})
    assert report["results"]["env_report"].get("verdict") in ("ok", "warn", "info")


def test_mleng_eval_runs_the_shipped_cases(installed):
    cases = _run(installed, str(installed["python"]), "-c",
                 "import mleng.engine.data as d; print(d.EVAL_CASES_DIR / 'cases.jsonl')").stdout.strip()
    out = _run(installed, str(installed["bin"] / "mleng"), "eval", "--cases", cases, "--router", "bm25",
               "--split", "heldout", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["n"] >= 50 and report["top1"] > 0.5


def test_a_local_drill_runs_from_the_wheel(installed, tmp_path):
    env = {**installed["env"], "MLENG_HOME": str(tmp_path / "home")}
    mleng = str(installed["bin"] / "mleng")

    def drill(*args):
        return subprocess.run([mleng, "drill", *args], capture_output=True, text=True, timeout=120,
                              cwd=installed["cwd"], env=env)

    listed = drill("list", "--json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) >= 15, listed.stderr[-2000:]
    started = drill("start", "pm-flight-recorder-hang", "--json")
    assert started.returncode == 0, started.stderr[-2000:]
    assert (tmp_path / "home" / "drill" / "work" / "fr_hung" / "fr_3").is_file()
    assert drill("stop").returncode == 0
    assert not (tmp_path / "home" / "drill" / "work").exists()


def test_mleng_serve_from_the_wheel_serves_knowledge_and_data(installed):
    script = r'''
import anyio, json, sys
from mcp import Client, StdioServerParameters

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["serve"], env=json.loads(sys.argv[2]))
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        index = (await c.read_resource("knowledge://index")).contents[0].text
        found = await c.call_tool("knowledge_search", {"query": "all_reduce busbw lower than expected"})
        spec = await c.call_tool("accelerator_specs", {"names": ["h100"]})
        print(json.dumps({"tools": len(names), "index_lines": index.count("knowledge://"),
                          "search_error": found.is_error, "hits": len(found.structured_content.get("hits", [])),
                          "specs_error": spec.is_error, "bf16": spec.structured_content["accelerators"][0]["dense_tflops"]["bf16"]}))

anyio.run(main)
'''
    out = _run(installed, str(installed["python"]), "-c", script, str(installed["bin"] / "mleng"),
               json.dumps(installed["env"]))
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["tools"] >= 24 and seen["index_lines"] >= 40
    assert not seen["search_error"] and seen["hits"] >= 1
    assert not seen["specs_error"] and seen["bf16"] > 900


def test_launch_script_from_the_wheel_names_a_module_the_wheel_has(installed):
    """Review 2026-12-01 F21: the script ran `python -m tools.dist_smoke_test`, which the wheel does not
    have (or a stranger's `tools` package would have run)."""
    out = _run(installed, str(installed["bin"] / "mleng"), "run", "launch_script", "--tool", "dist_smoke_test",
               "--nnodes", "2", "--gpus-per-node", "8", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    script = json.loads(out.stdout)["script"]
    assert " -m mleng.dist_smoke_test " in script and " -m tools." not in script
    found = _run(installed, str(installed["python"]), "-c",
                 "import importlib.util; print(importlib.util.find_spec('mleng.dist_smoke_test') is not None)")
    assert found.stdout.strip() == "True", found.stderr
