"""`mleng doctor`: every tool that declares a `doctor` hook, in order, with a one-screen summary and what
to do next (connect an agent by an absolute launcher, run one tool by hand)."""

import json
import sys
import time

from pydantic import ValidationError

from .data import PACKAGE
from .printable import shell_word
from .processes import local_gpu_count
from .rendering import VERDICT_MARK, clip
from .spec import ToolFailure, worst



def doctor(as_json: bool) -> int:
    from .registry import BROKEN, registry
    from .runner import execute
    from .store import host_provenance

    prov = host_provenance()
    context = {"gpu_count": local_gpu_count(), "gpu_names": prov["gpu_names"]}
    specs = sorted((s for s in registry().values() if s.doctor), key=lambda s: (s.doctor_order, s.name))
    rows, results, skipped = [], {}, []
    rows.append(_server_check(as_json, results))
    for spec in specs:
        overrides = spec.doctor(context)
        if overrides is None:
            skipped.append(spec.name)
            continue
        if not as_json:
            print(f"… {spec.name}", file=sys.stderr)
        started = time.monotonic()
        try:
            result = execute(spec, spec.Params(**overrides))
            verdict, first = result.verdict, (result.findings[0] if result.findings else "")
            results[spec.name] = result.model_dump(mode="json")
        except (ToolFailure, ValidationError) as e:
            verdict, first = "fail", str(e).splitlines()[0]
            results[spec.name] = {"verdict": "fail", "error": str(e)}
        rows.append((spec.name, verdict, time.monotonic() - started, first))
    if as_json:
        print(json.dumps({"host": prov["host"], "gpus": prov["gpu_names"], "ran": [r[0] for r in rows],
                          "skipped": skipped, "results": results}, indent=1))
    else:
        print(doctor_text(prov, rows, skipped, BROKEN))
    return 3 if any(r[1] == "fail" for r in rows) else 0


def doctor_text(prov: dict, rows: list[tuple[str, str, float, str]], skipped: list[str], broken) -> str:
    """doctor's screen: one row per check (its first finding cut at a word), then what to do next."""
    lines = [f"\nmleng doctor on {prov['host']}: {len(prov['gpu_names'])} NVIDIA GPU(s)"
             + (f" ({', '.join(sorted(set(prov['gpu_names'])))})" if prov["gpu_names"] else "")]
    lines += [f"  {VERDICT_MARK[verdict]}  {name:<22} {seconds:5.1f}s  {clip(first, 110)}"
              for name, verdict, seconds, first in rows]
    lines += [f"  FAIL  {PACKAGE}/{name} does not import: run `python -m {PACKAGE}.{name} --help` to see why"
              for name in broken]
    if skipped:
        lines.append(f"  Skipped here (no GPU, no SLURM client, or nothing of theirs to check): {', '.join(skipped)}")
    lines.append(f"\nOverall: {worst(r[1] for r in rows).upper()}. Next:")
    lines.append(f"  connect an agent (Claude Code, every directory): claude mcp add -s user mleng -- {server_launcher()}")
    lines.append("  one tool by hand: mleng run <tool> --help (mleng list names them; --json for machines)")
    return "\n".join(lines)


def server_launcher() -> str:
    """A command that starts this install's server from any directory, by absolute path (a host does not
    activate a venv: a bare `python` there is another Python, and the host says only "Failed to connect")."""
    from pathlib import Path

    from .data import IMPORT_ROOT

    if PACKAGE == "tools":   # a checkout
        return f"{shell_word(sys.executable)} {shell_word(str(IMPORT_ROOT / 'server.py'))}"
    script = Path(sys.executable).parent / "mleng"
    return f"{shell_word(str(script))} serve" if script.exists() else f"{shell_word(sys.executable)} -m mleng serve"


def _server_check(as_json: bool, results: dict) -> tuple[str, str, float, str]:
    """Start the MCP server as a host would (a new process over stdio) and ask it for tools/list."""
    import anyio
    from mcp import Client, StdioServerParameters

    from .processes import child_env
    from .registry import registry

    if not as_json:
        print("… mcp server", file=sys.stderr)
    started = time.monotonic()
    params = StdioServerParameters(command=sys.executable, args=["-m", f"{PACKAGE}.engine.cli", "serve"],
                                   env=child_env())

    async def tools_list() -> list[str]:
        with anyio.fail_after(60):
            async with Client(params) as client:
                return [t.name for t in (await client.list_tools()).tools]

    try:
        names = anyio.run(tools_list)
        missing = sorted(set(registry()) - set(names))
        verdict = "fail" if missing else "ok"
        first = (f"answers tools/list with {len(names)} tools" if not missing
                 else f"tools/list lacks {', '.join(missing)}")
    except Exception as e:  # noqa: BLE001 - any way the server fails to start is the finding
        verdict, first = "fail", f"the server did not answer tools/list: {type(e).__name__}: {str(e)[:200]}"
    results["mcp_server"] = {"verdict": verdict, "finding": first}
    return "mcp server (stdio)", verdict, time.monotonic() - started, first


# ---------------------------------------------------------------------------------------------------
