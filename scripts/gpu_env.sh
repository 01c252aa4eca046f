# Source this on the GPU machine: installs the carried wheels (pydantic, py-spy...) into a private folder
# and puts them on PYTHONPATH. The GPU machine has torch but no package registry.
#
# The folder is MLENG_GPU_ENV_DIR when the caller gives one it owns and no one else can write, else a new
# `mktemp -d` folder (0700). Never a fixed /tmp path: another user could create /tmp/site first and plant a
# sitecustomize.py there, which Python runs at start as whoever sourced this; and a fixed MLENG_HOME there
# would hand them the results and the HTTP token (security review 2026-12-02, R1 and R17). Remove the
# folder when done: rm -rf "$MLENG_GPU_ENV_DIR".
set -u
if [ -n "${MLENG_GPU_ENV_DIR:-}" ] && { [ ! -O "$MLENG_GPU_ENV_DIR" ] || [ -L "$MLENG_GPU_ENV_DIR" ] \
     || [ -n "$(find "$MLENG_GPU_ENV_DIR" -maxdepth 0 -perm /022)" ]; }; then
  echo "gpu_env.sh: $MLENG_GPU_ENV_DIR is not a folder of yours that only you can write; using a new private one" >&2
  MLENG_GPU_ENV_DIR=
fi
if [ -z "${MLENG_GPU_ENV_DIR:-}" ]; then
  MLENG_GPU_ENV_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mleng-gpu-env.XXXXXXXX") || return 1 2>/dev/null || exit 1
fi
chmod 700 "$MLENG_GPU_ENV_DIR"
export MLENG_GPU_ENV_DIR
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$MLENG_GPU_ENV_DIR/site" .whl/*.whl \
    && export PYTHONPATH=$MLENG_GPU_ENV_DIR/site${PYTHONPATH:+:$PYTHONPATH} \
    && export PATH=$MLENG_GPU_ENV_DIR/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1 MLENG_HOME=${MLENG_HOME:-$MLENG_GPU_ENV_DIR/home}
