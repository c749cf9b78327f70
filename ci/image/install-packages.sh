#!/bin/sh
# Runs inside `docker build` (the Dockerfile's `packages` stage), from /tmp/packages, which holds
# requirements.lock, requirements-torch.lock, this folder, and the wheels of .wheelhouse/ if any.
#
# Installs what the image adds on top of the base into a venv at $VENV that also sees the base's
# own site-packages: the DLC's Neuron-built torch (and torch-neuronx, neuronx-cc) is used as it is
# and never replaced; a package the lock pins at another version than the base has shadows the
# base's copy inside the venv only. Fails the build when `pip check` finds a problem the base did
# not already have, or when a package of the closure does not import.
#
# Build args (see the Dockerfile): PIP_OFFLINE, TORCHTITAN, TORCHTITAN_NEURON_REF.
set -eu
cd /tmp/packages

if [ "$PIP_OFFLINE" = 1 ]; then
    set -- --no-index --find-links /tmp/packages
    echo "install-packages: hermetic, from the wheels in the build context only"
else
    set --
    echo "install-packages: from the package index"
fi
base_python=$(command -v python3)
"$base_python" -c 'import sys; v = sys.version_info; sys.exit(None if v >= (3, 11) else f"base python3 is {v.major}.{v.minor}; the image needs >= 3.11")'
"$base_python" -c 'import torch' || { echo "install-packages: the base image has no torch; it must bring its own (the DLC, or ci/standin)"; exit 1; }

# The base's own `pip check` findings, if any, are not this image's to fix (-m pip may be absent).
"$base_python" -m pip check >/tmp/pip-check.base 2>&1 || true

"$base_python" -m venv --system-site-packages "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-input --no-cache-dir "$@"; }
pip install --progress-bar off "$@" --no-deps --require-hashes -r requirements.lock

# torchtitan 0.3.0 imports triton at module level (torchtitan.train -> ... minimal_async_ep.kernels)
# although it never runs a triton kernel on Neuron or CPU. torch's public CUDA wheel brings triton
# (the stand-in base has it); a base whose torch does not gets the triton that requirements-torch.lock
# pins for this torch.
if ! "$VENV/bin/python" -c 'import triton' 2>/dev/null; then
    echo "install-packages: the base has no triton; installing the one requirements-torch.lock pins"
    awk '/^triton==/ { found = 1 } found { print } found && !/\\$/ { exit }' requirements-torch.lock >triton.txt
    pip install --progress-bar off "$@" --no-deps --require-hashes -r triton.txt
fi

if [ "$TORCHTITAN" = neuron ]; then
    # The torchtitan-neuron fork, at a pinned ref, over torchtitan 0.3.0 (same distribution name:
    # pip replaces it). Offline, `make image --torchtitan neuron` puts its wheel in .wheelhouse/.
    if [ "$PIP_OFFLINE" = 1 ]; then
        source=$(ls /tmp/packages/torchtitan*neuron*.whl 2>/dev/null | head -n 1) || true
        [ -n "$source" ] || { echo "install-packages: TORCHTITAN=neuron but no torchtitan-neuron wheel in .wheelhouse/"; exit 1; }
    else
        # a pinned commit only: a branch would install whatever it points at on the day of the build
        echo "$TORCHTITAN_NEURON_REF" | grep -Eqx '[0-9a-f]{40}' || {
            echo "install-packages: TORCHTITAN_NEURON_REF='$TORCHTITAN_NEURON_REF' is not a 40-hex commit"; exit 1; }
        source="git+https://github.com/aws-neuron/torchtitan-neuron@${TORCHTITAN_NEURON_REF}"
    fi
    pip install --progress-bar off "$@" --no-deps "$source"
elif [ "$TORCHTITAN" != pypi ]; then
    echo "install-packages: TORCHTITAN=$TORCHTITAN is not one of: pypi, neuron"
    exit 1
fi

pip check >/tmp/pip-check.venv 2>&1 || true
grep -vxF -f /tmp/pip-check.base /tmp/pip-check.venv | grep -v '^No broken requirements found' >/tmp/pip-check.new || true
if [ -s /tmp/pip-check.new ]; then
    echo "install-packages: pip check found problems this image introduced:"
    cat /tmp/pip-check.new
    exit 1
fi
echo "install-packages: pip check clean (beyond what the base already reported)"

"$VENV/bin/python" /tmp/packages/import-check.py requirements.lock
