"""`python server.py [--http HOST:PORT]`: the mleng MCP server from a checkout (same as `mleng serve`).

A thin launcher: the wiring lives in tools/engine/mcp_server.py. Started by a Python that lacks the server's
packages (a host runs a bare `python3`, not the venv's), it says so in one line on stderr, which is where a
host's log shows why it could not connect, instead of a traceback.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python /path/to/server.py` from anywhere

try:
    from tools.engine.mcp_server import main  # noqa: E402
except ModuleNotFoundError as e:
    sys.exit(f"mleng: {sys.executable} lacks {e.name!r}, which the server needs: start the server with the "
             "Python mleng is installed in, by its absolute path (/path/to/venv/bin/python server.py, or "
             "/path/to/venv/bin/mleng serve), or with uvx --from /path/to/mleng mleng serve.")

if __name__ == "__main__":
    main()
