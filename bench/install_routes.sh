#!/usr/bin/env bash
# The install routes of the light server, measured on one machine in one run (issue 37): pip into a venv, pipx,
# uvx, and the Claude Code plugin's launcher (scripts/serve.sh, which falls back on uvx). For each: install time,
# size on disk, tools listed over stdio by a real MCP client (and the time to that answer), and one measured tool
# run in the job's own Python ($MLENG_PYTHON), whose answer names the stack it measured.
#
# Made for a machine with no package registry (the GPU machine): every route installs from WHEELS only (a folder
# of wheels: mleng's own, its dependencies, pipx's, uv's and setuptools for the plugin's build from source).
#
#   bench/install_routes.sh WHEELS JOB_PYTHON [TOOL_ARGS...]
#   e.g. MCP_ARGS='{"mode": "quick"}' bench/install_routes.sh .whl-routes /opt/torch/.venv/bin/python3 matmul_bench --mode quick
# (MCP_ARGS: the same tool arguments as JSON, for the plugin route, which is called over MCP as a host calls it.)
#
# Everything goes into one mktemp -d folder, removed at the end.
set -uo pipefail
wheels=$(cd "$1" && pwd); job_python=$2; shift 2
tool=("${@:-env_report}")
repo=$(cd "$(dirname "$0")/.." && pwd)
base_python=$(python3 -c 'import sys; print(sys._base_executable)')
work=$(mktemp -d "${TMPDIR:-/tmp}/mleng-routes.XXXXXXXX"); chmod 700 "$work"
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work/tmp; mkdir "$TMPDIR"   # uv's build locks and pip's scratch go here, not in /tmp
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$wheels PIP_DISABLE_PIP_VERSION_CHECK=1
export UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS=$wheels UV_CACHE_DIR=$work/uv-cache UV_TOOL_DIR=$work/uv-tools \
       UV_PYTHON=$base_python UV_PYTHON_DOWNLOADS=never
export PIPX_HOME=$work/pipx PIPX_BIN_DIR=$work/pipx-bin MLENG_HOME=$work/home

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
size() { du -sh "$@" 2>/dev/null | awk '{print $1}' | paste -sd+ -; }

# A client venv (mcp from the wheels) that lists the tools of a server started as a host would start it.
"$base_python" -m venv "$work/client" && "$work/client/bin/pip" install -q mcp >/dev/null || exit 1
cat > "$work/list_tools.py" <<'EOF'
import json, os, sys, time, anyio
from mcp import Client, StdioServerParameters
# argv: [--call TOOL JSON_ARGS] COMMAND ARGS...: list the tools; with --call, also call one over MCP, as a host would.
call = sys.argv[2:4] if sys.argv[1] == "--call" else None
server = sys.argv[4:] if call else sys.argv[1:]
async def main():
    started = time.perf_counter()
    async with Client(StdioServerParameters(command=server[0], args=server[1:], env=dict(os.environ))) as client:
        tools = (await client.list_tools()).tools
        print(f"{len(tools)} tools listed over stdio in {time.perf_counter() - started:.1f} s")
        if call:
            started = time.perf_counter()
            result = await client.call_tool(call[0], json.loads(call[1]))
            text = " ".join(getattr(c, "text", "") for c in result.content)
            measured = text[text.find("Measured with"):][:200] if "Measured with" in text else text[-300:]
            measured = " ".join(measured.split())
            print(f"{call[0]} over MCP: {time.perf_counter() - started:.1f} s, error={result.is_error}; {measured}")
anyio.run(main)
EOF
list_tools() {  # its two answer lines, or the end of what went wrong
    timeout 300 "$work/client/bin/python" "$work/list_tools.py" "$@" > "$work/client.out" 2>&1
    grep -E "tools listed|over MCP" "$work/client.out" || tail -3 "$work/client.out"
}
measure() {  # route name, the mleng command (a list)
    local t0; t0=$(now)
    MLENG_PYTHON=$job_python timeout 300 "$@" run "${tool[@]}" > "$work/answer.txt" 2>&1
    echo "  $1 run ${tool[0]} in the job's Python: exit $?, $(since "$t0") s; $(grep -m1 -o 'Measured with.*' "$work/answer.txt" || tail -c 300 "$work/answer.txt")"
    grep -m3 -E 'TFLOPS|TB/s|GB/s' "$work/answer.txt" | sed 's/^/    /'
}
echo "machine: $(uname -m), $(nproc) cores; base Python $("$base_python" -V 2>&1) at $base_python; job Python $job_python"
echo "wheels: $(ls "$wheels" | wc -l) files, $(size "$wheels")"

echo "== pip: python -m venv + pip install mleng"
t0=$(now); "$base_python" -m venv "$work/pip-venv" && "$work/pip-venv/bin/pip" install -q mleng >/dev/null
echo "  installed in $(since "$t0") s, venv $(size "$work/pip-venv"), torch: $("$work/pip-venv/bin/python" -c 'import torch' 2>/dev/null && echo yes || echo no)"
echo "  $(list_tools "$work/pip-venv/bin/mleng" serve)"
measure "$work/pip-venv/bin/mleng"

echo "== pipx install mleng"
"$base_python" -m venv "$work/pipx-itself" && "$work/pipx-itself/bin/pip" install -q pipx >/dev/null
t0=$(now); "$work/pipx-itself/bin/pipx" install --pip-args="--no-index --find-links $wheels" "$(ls "$wheels"/mleng-*.whl)" > "$work/pipx.log" 2>&1 \
    || tail -5 "$work/pipx.log"
echo "  installed in $(since "$t0") s, $(size "$PIPX_HOME/venvs/mleng")"
echo "  $(list_tools "$PIPX_BIN_DIR/mleng" serve)"
measure "$PIPX_BIN_DIR/mleng"

echo "== uvx --from mleng mleng serve (first start, empty cache)"
"$base_python" -m venv "$work/uv-itself" && "$work/uv-itself/bin/pip" install -q uv >/dev/null
uvx=("$work/uv-itself/bin/uv" tool run --from "$(ls "$wheels"/mleng-*.whl)")
t0=$(now); first=$(list_tools "${uvx[@]}" mleng serve)
echo "  first start: $first ($(since "$t0") s to the answer, install included), cache $(size "$UV_CACHE_DIR")"
echo "  second start: $(list_tools "${uvx[@]}" mleng serve)"
measure "${uvx[@]}" mleng

echo "== plugin launcher (scripts/serve.sh from a copy of the checkout, no .venv: falls back on uvx, built from source)"
cp -r "$repo" "$work/plugin-root" && rm -rf "$work/plugin-root/.venv" "$work/plugin-root/.whl"* "$work/plugin-root/build"
rm -rf "$UV_CACHE_DIR"
t0=$(now)
PATH=$work/uv-itself/bin:$PATH MLENG_PYTHON=$job_python list_tools --call "${tool[0]}" "${MCP_ARGS:-{\}}" \
    "$work/plugin-root/scripts/serve.sh" | sed 's/^/  /'
echo "  ($(since "$t0") s in all, the build from source included)"
