#!/bin/sh
# The plugin's launcher (.claude-plugin/plugin.json): the mleng server, from any directory, in a Python that has
# its packages. A host starts it with no venv active, so a bare `python3` is usually the system's, and the host
# shows only "Failed to connect". Tried in order: $MLENG_SERVER_PYTHON; the checkout's .venv; uvx (which
# installs the light server into its own cache); else python3, and server.py says what is missing.
root=$(cd "$(dirname "$0")/.." && pwd)
for python in "${MLENG_SERVER_PYTHON:-}" "$root/.venv/bin/python"; do
    if [ -n "$python" ] && [ -x "$python" ]; then
        exec "$python" "$root/server.py" "$@"
    fi
done
if command -v uvx >/dev/null 2>&1; then
    exec uvx --from "$root" mleng serve "$@"
fi
exec python3 "$root/server.py" "$@"
