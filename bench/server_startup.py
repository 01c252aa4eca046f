"""Server start-up: spawn `python server.py` until tools/list is answered, beside a bare MCPServer
with one tool, in one run, alternating, and print the ratio of medians (target: <= 1.5x).

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
        ours, base = [], []
        await time_to_tools_list(["server.py"], env)  # warm the page cache for both
        await time_to_tools_list([bare], env)
        for _ in range(runs):
            t, n_ours = await time_to_tools_list(["server.py"], env)
            ours.append(t)
            t, _ = await time_to_tools_list([bare], env)
            base.append(t)
    m_ours, m_base = statistics.median(ours), statistics.median(base)
    print(f"mleng server ({n_ours} tools): median {m_ours * 1000:.0f} ms  (runs: {', '.join(f'{x*1000:.0f}' for x in ours)})")
    print(f"bare MCPServer (1 tool):    median {m_base * 1000:.0f} ms  (runs: {', '.join(f'{x*1000:.0f}' for x in base)})")
    print(f"ratio: {m_ours / m_base:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    anyio.run(main, parser.parse_args().runs)
