# Source this on the GPU machine (which has torch, triton and transformers but no package index):
#   source e2e/gpu_env.sh
# It installs the carried serving wheels (.whl/, made by ../shared/tools/gpu-wheels) into /tmp/site
# and makes the repository importable as pagoda.* without pip, by linking each folder under
# /tmp/pagoda-src/pagoda/ the way setup.py's package-dir mapping does.
set -e
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if compgen -G "$repo/.whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$repo"/.whl/*.whl
fi
mkdir -p /tmp/pagoda-src/pagoda
for part in runtime kernels operator; do ln -sfn "$repo/$part" "/tmp/pagoda-src/pagoda/$part"; done
export PYTHONPATH="/tmp/pagoda-src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
set +e
