"""`python server.py [--http HOST:PORT]`: the mleng MCP server from a checkout (same as `mleng serve`).

A thin launcher: the wiring lives in tools/engine/mcp_server.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python /path/to/server.py` from anywhere

from tools.engine.mcp_server import main  # noqa: E402

if __name__ == "__main__":
    main()
