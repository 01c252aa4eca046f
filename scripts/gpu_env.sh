# Source this on the GPU machine: installs the carried wheels (pydantic, py-spy...) into /tmp/site
# and puts them on PYTHONPATH. The GPU machine has torch but no package registry.
set -u
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} && export PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1 MLENG_HOME=${MLENG_HOME:-/tmp/mleng-home}
