"""SKILL.md and the Claude Code plugin layout: valid, consistent with the registry and the knowledge tree.

An agent trusts what SKILL.md says: a tool name, argument, command line or page that does not exist
sends it down a dead end, so each is checked against the real thing.
"""

import fnmatch
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tools.engine.registry import registry

ROOT = Path(__file__).resolve().parent.parent
SKILL = ROOT / "SKILL.md"
PLUGIN_SKILL = ROOT / "skills" / "mleng" / "SKILL.md"
COMMON_ARGS = {"wait_s", "timeout_s", "node"}  # the server adds these to subprocess tools


def _text() -> str:
    return SKILL.read_text(encoding="utf-8")


def _body() -> str:
    return _text().split("---", 2)[2]


def _routing() -> str:
    """The symptom tree and the pasted-output table: where SKILL.md routes."""
    return _body().split("## Symptom → first tool")[1].split("## Worked examples")[0]


def test_skill_validates_with_skills_ref():
    skills_ref = pytest.importorskip("skills_ref")
    assert skills_ref.validate(PLUGIN_SKILL.parent) == []
    props = skills_ref.read_properties(PLUGIN_SKILL.parent)
    assert props.name == "mleng" == PLUGIN_SKILL.parent.name
    assert len(props.description) < 1024


def test_plugin_copy_is_identical_to_the_top_level_skill():
    assert PLUGIN_SKILL.read_bytes() == SKILL.read_bytes(), "run: cp SKILL.md skills/mleng/SKILL.md"


def test_description_speaks_the_users_words_and_says_what_it_is_not_for():
    import yaml

    description = yaml.safe_load(_text().split("---", 2)[1])["description"]
    for phrase in ("stuck", "hangs", "NCCL timeout", "slow all-reduce", "OOM", "MFU", "Xid", "SLURM"):
        assert phrase in description, phrase
    assert "Not for" in description


def test_body_is_short():
    # Issue 27: SKILL.md at most half of its 24,507 characters at c795dde; it routes, the tool
    # descriptions say what each tool does (bench/agent_reading_cost.py measures both).
    assert len(_text()) <= 12_250, f"SKILL.md is {len(_text())} characters; budget 12,250"


def test_every_registered_tool_is_routed_to():
    named = set(re.findall(r"\b([a-z][a-z0-9_]+)\b", _routing()))
    assert sorted(set(registry()) - named) == []


def test_arguments_named_in_the_routing_are_real_parameters():
    """`tool(arg=...)` and `tool (arg=...)` in the tree name parameters that tool takes."""
    for name, args in re.findall(r"(\w+) ?\(([^()]*)\)", _routing()):
        spec = registry().get(name)
        if spec is None:
            continue
        fields = set(spec.Params.model_fields) | COMMON_ARGS
        for arg in re.findall(r"(\w+)=", args):
            assert arg in fields, f"{name}: no parameter {arg!r}"


def test_tools_named_in_the_decision_tree_exist():
    tree = _routing()
    named = set(re.findall(r"->\s*(\w+)", tree)) | set(re.findall(r"`(\w+)`", tree))
    named = {n for n in named if "_" in n or n in registry()}
    assert named - set(registry()) == set()
    assert len(named) >= 15


def test_command_lines_parse_with_the_real_cli():
    from tools.engine.cli import _coerce, tool_parser

    lines = re.findall(r"mleng run ([a-z]\w+)([^\n#`)]*)", _body())
    assert len(lines) >= 1   # few on purpose: SKILL.md is held to the reading budget (test_reading_budget.py)
    for name, rest in lines:
        spec = registry()[name]  # KeyError: SKILL.md names a module that is not a tool
        args = shlex.split(rest)
        if args == ["--help"]:
            continue
        parsed = vars(tool_parser(spec, prog=name).parse_args(args))  # SystemExit on an unknown flag
        spec.Params(**{k: _coerce(v) for k, v in parsed.items() if k in spec.Params.model_fields and v is not None})


def test_knowledge_pages_it_names_exist():
    pages = set(re.findall(r"knowledge://([\w./-]+\.md)", _body()))
    assert len(pages) >= 3   # few on purpose: the reading budget; each result's `next` names the rest
    missing = sorted(p for p in pages if not (ROOT / "knowledge" / p).is_file())
    assert missing == []


def _plugin_server() -> dict:
    return json.loads((ROOT / ".claude-plugin" / "plugin.json").read_text())["mcpServers"]["mleng"]


def test_plugin_manifest_marketplace_and_mcp_config():
    manifest = json.loads((ROOT / ".claude-plugin" / "plugin.json").read_text())
    assert manifest["name"] == "mleng"
    # The repository is also a one-plugin marketplace: /plugin marketplace add <repo>; /plugin install mleng@mleng
    market = json.loads((ROOT / ".claude-plugin" / "marketplace.json").read_text())
    assert market["owner"]["name"] and [p["name"] for p in market["plugins"]] == ["mleng"]
    assert (ROOT / market["plugins"][0]["source"] / ".claude-plugin" / "plugin.json").is_file()
    server = _plugin_server()
    # Not a bare python3: a host starts it with no venv active (review 2026-12-02: "Failed to connect").
    assert server["command"] == "${CLAUDE_PLUGIN_ROOT}/scripts/serve.sh" and server["args"] == []
    assert market["metadata"]["description"]   # `claude plugin validate` warns without one
    # Claude Code 2.1 expands plain ${CLAUDE_PLUGIN_ROOT} only: "${VAR:-default}" reaches python as text.
    assert ":-" not in json.dumps(server)
    # No root .mcp.json: inside the checkout Claude Code would read it as a project-scope server too,
    # and it would clash with `claude mcp add mleng` ("Conflicting scopes").
    assert not (ROOT / ".mcp.json").exists()


@pytest.mark.anyio
async def test_the_plugin_starts_the_server_from_any_working_directory(tmp_path):
    """What Claude Code runs for the plugin: ${CLAUDE_PLUGIN_ROOT} replaced by the plugin's path, in the
    user's project directory (not the checkout), serves the registry and the diagnose prompt."""
    from mcp import Client, StdioServerParameters

    server = _plugin_server()

    def expand(s: str) -> str:
        return s.replace("${CLAUDE_PLUGIN_ROOT}", str(ROOT))

    project = tmp_path / "someone-elses-project"
    (project / "tools").mkdir(parents=True)           # a user's own `tools/` package must not shadow ours
    (project / "tools" / "__init__.py").write_text("raise ImportError('the user project tools package')\n")
    params = StdioServerParameters(command=expand(server["command"]), args=[expand(a) for a in server["args"]],
                                   cwd=str(project), env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                                                          "MLENG_HOME": str(tmp_path / "home"),
                                                          "MLENG_SERVER_PYTHON": sys.executable})
    async with Client(params) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        answer = await client.call_tool("accelerator_specs", {"names": ["h100"]})
    assert names == set(registry())
    assert "diagnose" in prompts  # SKILL.md points agents at it
    assert not answer.is_error


def test_worked_example_calls_are_valid_arguments():
    import ast

    section = _body().split("## Worked examples")[1].split("\n## ")[0]
    calls = re.findall(r"`(\w+)\((.*?)\)`", section, flags=re.S)
    assert len(calls) >= 5   # few on purpose: SKILL.md is held to the reading budget (test_reading_budget.py)
    for name, args in calls:
        spec = registry()[name]
        call = ast.parse(f"f({' '.join(args.split())})", mode="eval").body
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        assert not call.args, f"{name}: use keyword arguments"
        spec.Params(**{k: v for k, v in kwargs.items() if k not in COMMON_ARGS})  # ValidationError if wrong
