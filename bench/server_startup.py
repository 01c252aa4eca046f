"""Server start-up: spawn `python server.py` until tools/list is answered, beside a bare MCPServer
with one tool, in one run, alternating, and print the ratio of medians (target: <= 1.5x).

Two figures for ours: with its tool list cached in $MLENG_HOME (every start after the first for an
unchanged installation) and cold (an empty $MLENG_HOME each time: every tool module imported and
every schema built).

    python bench/server_startup.py [--runs 7]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import anyio
from mcp import Client, StdioServerParameters

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BARE = '''
from mcp.server import MCPServer
server = MCPServer("bare")

@server.tool()
def ping() -> str:
    """Answer pong."""
    return "pong"

server.run()
'''


async def time_to_tools_list(args: list[str], env: dict) -> tuple[float, int]:
    params = StdioServerParameters(command=sys.executable, args=args, cwd=REPO, env=env)
    started = time.perf_counter()
    async with Client(params) as c:
        tools = (await c.list_tools()).tools
        return time.perf_counter() - started, len(tools)


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as home:
        bare = os.path.join(home, "bare_server.py")
        with open(bare, "w") as f:
            f.write(BARE)
        env = {"PATH": os.environ["PATH"], "MLENG_HOME": home, "HOME": os.environ.get("HOME", home)}
        ours, cold, base = [], [], []
        await time_to_tools_list(["server.py"], env)  # warm the page cache for both (and write our tool list)
        await time_to_tools_list([bare], env)
        for i in range(runs):
            t, n_ours = await time_to_tools_list(["server.py"], env)
            ours.append(t)
            cold_home = os.path.join(home, f"cold{i}")
            t, _ = await time_to_tools_list(["server.py"], {**env, "MLENG_HOME": cold_home})
            cold.append(t)
            t, _ = await time_to_tools_list([bare], env)
            base.append(t)
    m_base = statistics.median(base)
    for label, times in ((f"mleng server ({n_ours} tools), tool list cached", ours),
                         (f"mleng server ({n_ours} tools), cold", cold), ("bare MCPServer (1 tool)", base)):
        m = statistics.median(times)
        print(f"{label:<42} median {m * 1000:5.0f} ms  {m / m_base:.2f}x  (runs: {', '.join(f'{x*1000:.0f}' for x in times)})")
    print(f"ratio, cached: {statistics.median(ours) / m_base:.2f}x; cold: {statistics.median(cold) / m_base:.2f}x "
          "(target <= 1.5x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    anyio.run(main, parser.parse_args().runs)
