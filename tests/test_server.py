"""The MCP server through real clients: in-memory (both protocol eras), stdio subprocess, HTTP."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import anyio
import psutil
import pytest
from mcp import Client, StdioServerParameters

import fault_tools
from tools.engine.mcp_server import build_server
from tools.engine.registry import registry
from tools.engine.spec import SELF_EVIDENT, SELF_TEST

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.anyio
MODES = ["modern", "legacy"]


def client(server, mode):
    return Client(server) if mode == "modern" else Client(server, mode="legacy")


@pytest.mark.parametrize("mode", MODES)
async def test_tools_listed_with_schemas_and_annotations(mode):
    async with client(build_server(), mode) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == set(registry())
    for name, tool in tools.items():
        spec = registry()[name]
        assert tool.description == spec.description
        assert tool.output_schema and "verdict" in tool.output_schema["properties"], name
        props = tool.input_schema.get("properties", {})
        public = {f for f, info in spec.Params.model_fields.items() if info.json_schema_extra != SELF_TEST}
        assert set(props) & set(spec.Params.model_fields) == public, name   # self-test switches stay out
        for field in public:   # a SELF_EVIDENT field ('layers') is published bare; --help still describes it
            info = spec.Params.model_fields[field]
            assert info.description, f"{name}.{field} has no description"
            if info.json_schema_extra != SELF_EVIDENT:
                assert props[field].get("description"), f"{name}.{field} has no description in the schema"
        assert tool.annotations.read_only_hint == spec.read_only
        assert tool.annotations.destructive_hint == spec.destructive
        # the rule tools/README.md states: a tool that can replace a file or submit jobs is destructive;
        # besides those, only job_cancel (it ends a run)
        can_replace_or_submit = bool({"overwrite", "submit"} & set(spec.Params.model_fields))
        assert spec.destructive == (can_replace_or_submit or name == "job_cancel"), name
        assert not (spec.read_only and spec.destructive), name
        if spec.runs == "subprocess":
            assert {"wait_s", "timeout_s"} <= set(props)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,args", [
    ("env_report", {"probe_torch": False}),
    ("gpu_health", {}),
    ("accelerator_specs", {"names": ["h100 sxm", "MI300X"]}),
    ("knowledge_search", {"query": "why is busbw higher than algbw"}),
    ("results_history", {}),
])
async def test_first_tools_called_and_results_validate(mode, name, args):
    async with client(build_server(), mode) as c:
        r = await c.call_tool(name, args)
    assert not r.is_error, r.content[0].text
    result = registry()[name].Result.model_validate(r.structured_content)
    assert result.verdict in ("ok", "warn", "fail", "info") and result.findings
    text = r.content[0].text
    assert text.startswith(f"{name}: {result.verdict.upper()}") and "Result JSON" not in text
    assert all(finding in text for finding in result.findings)     # the text is the answer, each fact once


async def test_gpu_health_on_a_machine_without_gpus_is_info_not_a_crash():
    if psutil.os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    async with Client(build_server()) as c:
        r = await c.call_tool("gpu_health", {})
    assert not r.is_error and r.structured_content["verdict"] == "info"
    assert "No NVIDIA GPU" in r.structured_content["findings"][0]


async def test_accelerator_specs_compares_side_by_side():
    async with Client(build_server()) as c:
        r = await c.call_tool("accelerator_specs", {"names": ["H100-SXM5-80GB", "h200"]})
    data = r.structured_content
    assert [a["id"] for a in data["accelerators"]] == ["h100-sxm", "h200"]
    assert data["ratios_vs_first"]["h200"]["memory_gb"] == pytest.approx(141 / 80, abs=0.01)


@pytest.mark.parametrize("name,args,needle", [
    ("accelerator_specs", {"names": "h100"}, "names"),                 # wrong type
    ("knowledge_search", {"query": "x"}, "query"),                     # too short
    ("knowledge_search", {"query": "ok query", "k": 999}, "k"),        # out of range
    ("results_history", {"limitt": 3}, "limitt"),                      # misspelled argument
    ("no_such_tool", {}, "no_such_tool"),                              # unknown tool
])
async def test_bad_input_is_a_clear_error_and_the_server_lives_on(name, args, needle):
    async with Client(build_server()) as c:
        r = await c.call_tool(name, args)
        assert r.is_error and needle in r.content[0].text
        ok = await c.call_tool("knowledge_search", {"query": "xid 79"})
        assert not ok.is_error


async def test_knowledge_resources_and_traversal_refused():
    async with Client(build_server()) as c:
        index = await c.read_resource("knowledge://index")
        assert "knowledge://network/busbw.md" in index.contents[0].text
        page = await c.read_resource("knowledge://network/busbw.md")
        assert "busbw" in page.contents[0].text
        for bad in ("knowledge://../../etc/passwd", "knowledge://../pyproject.toml", "knowledge://nope.md"):
            with pytest.raises(Exception):
                await c.read_resource(bad)
        assert not (await c.call_tool("knowledge_search", {"query": "nvlink"})).is_error


async def test_diagnose_prompt_plans_for_the_symptom_it_was_given():
    cases = {"training hangs at step 300, GPU util 0%, the processes are still alive": "hang_stack_dump",
             "CUDA out of memory: will llama-3-70b fit on 8 H100 with ZeRO-3?": "memory_estimate",
             "SLURM job 812345 failed overnight with exit code 137, why?": "slurm_job_diagnose",
             "all-reduce busbw between our two nodes is far below what InfiniBand NDR should give":
                 "collective_bench"}
    plans = {}
    async with Client(build_server()) as c:
        for symptom, expected in cases.items():
            text = (await c.get_prompt("diagnose", {"symptom": symptom})).messages[0].content.text
            plan = text.split("best match first:")[1].split("\n\n")[0]
            assert symptom in text and expected in plan, (symptom, plan)
            plans[symptom] = plan
    assert len(set(plans.values())) == len(cases)    # not the same text whatever the symptom


async def test_slow_run_returns_a_job_handle_then_job_status_and_cancel(tmp_path):
    pid_file = tmp_path / "pids"
    server = build_server(list(registry().values()) + [fault_tools.SLEEPER])
    async with Client(server) as c:
        r = await c.call_tool("test_sleeper", {"pid_file": str(pid_file), "wait_s": 1.5})
        assert not r.is_error
        job_id = r.structured_content["job"]["job_id"]
        status = await c.call_tool("job_status", {"job_id": job_id})
        assert status.structured_content["jobs"][0]["state"] == "running"
        for _ in range(50):
            if pid_file.exists() and pid_file.read_text():
                break
            await anyio.sleep(0.1)
        pids = [int(p) for p in pid_file.read_text().split()]
        cancel = await c.call_tool("job_cancel", {"job_id": job_id})
        assert cancel.structured_content["state"] == "cancelled"
        status = await c.call_tool("job_status", {"job_id": job_id})
        assert status.structured_content["verdict"] == "fail"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


async def test_job_status_waits_for_a_run_to_end_through_the_server():
    # job_status's own wait_s reaches it: the server takes wait_s as an execution option only from subprocess tools
    server = build_server(list(registry().values()) + [fault_tools.NAPPER])
    async with Client(server) as c:
        r = await c.call_tool("test_napper", {"seconds": 3, "wait_s": 0.2})
        job_id = r.structured_content["job"]["job_id"]
        t0 = time.monotonic()
        status = await c.call_tool("job_status", {"job_id": job_id, "wait_s": 20})
        assert not status.is_error and status.structured_content["jobs"][0]["state"] == "done", status.content
        assert status.structured_content["result"]["slept_s"] == 3 and time.monotonic() - t0 < 15


@pytest.mark.slow
async def test_client_cancellation_kills_the_run(tmp_path):
    pid_file = tmp_path / "pids"
    server = build_server([fault_tools.SLEEPER])
    async with Client(server) as c:
        with anyio.move_on_after(3):
            await c.call_tool("test_sleeper", {"pid_file": str(pid_file), "wait_s": 60})
        await anyio.sleep(0.5)
    pids = [int(p) for p in pid_file.read_text().split()]
    deadline = time.time() + 10
    while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


async def test_crashing_child_is_a_tool_error_and_the_next_call_succeeds():
    server = build_server([fault_tools.ABORTER, fault_tools.NOISY])
    async with Client(server) as c:
        r = await c.call_tool("test_aborter", {})
        assert r.is_error and "SIGABRT" in r.content[0].text
        r = await c.call_tool("test_noisy", {})
        assert not r.is_error and r.structured_content["findings"] == ["done"]


async def test_real_stdio_server(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["server.py"], cwd=REPO,
                                   env={"MLENG_HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert "env_report" in names
        r = await c.call_tool("accelerator_specs", {"names": ["b200"]})
        assert not r.is_error and r.structured_content["accelerators"][0]["id"] == "b200"


TOKEN = "test-token-0123456789-abcdefghijklmnop"   # 32+ characters, as the server requires


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_without_a_token_beyond_loopback_is_refused(tmp_path):
    env = {**os.environ, "MLENG_HOME": str(tmp_path)}
    env.pop("MLENG_HTTP_TOKEN", None)
    out = subprocess.run([sys.executable, "server.py", "--http", f"0.0.0.0:{_free_port()}", "--no-auth"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--no-auth serves only loopback" in out.stderr


def test_http_request_without_token_is_refused(tmp_path):
    port = _free_port()
    env = {**os.environ, "MLENG_HOME": str(tmp_path), "MLENG_HTTP_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "server.py", "--http", f"0.0.0.0:{port}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

        def post(extra):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers=headers | extra)
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code

        for _ in range(100):
            try:
                status = post({})
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        assert status == 401
        assert post({"Authorization": "Bearer wrong"}) == 401
        assert post({"Authorization": f"Bearer {TOKEN}"}) not in (401, 403)
    finally:
        proc.terminate()
        proc.wait(10)


def test_server_start_imports_no_torch():
    code = ("import sys, asyncio; from tools.engine.mcp_server import build_server; s = build_server(); "
            "asyncio.run(s.list_tools()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.slow
def test_a_cached_tool_list_serves_without_importing_tool_modules(tmp_path):
    """Start-up: after the first start, tools/list comes from $MLENG_HOME/cache and a tool's module is
    imported on its first call; a changed package (another key) or a damaged file rebuilds the list."""
    code = ("import asyncio, json, sys; from tools.engine.mcp_server import build_server; s = build_server(); "
            "names = [t.name for t in asyncio.run(s.list_tools())]; "
            "r = asyncio.run(s.call_tool('accelerator_specs', {'names': ['h100']})); "
            "print(json.dumps({'n': len(names), 'matmul_imported': 'tools.matmul_bench' in sys.modules, "
            "'accel_ok': not r.is_error}))")

    def start():
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "MLENG_HOME": str(tmp_path)})
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = start()
    assert first == {"n": len(registry()), "matmul_imported": True, "accel_ok": True}
    cached = list((tmp_path / "cache").glob("tools-*.json"))
    assert len(cached) == 1
    assert start() == {"n": len(registry()), "matmul_imported": False, "accel_ok": True}
    cached[0].write_text("{not json")
    assert start()["n"] == len(registry())
