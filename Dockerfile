# neuron-qwen3: torchtitan recipes that train Qwen3 three ways (v5, native, nki_moe) on Trainium.
#
# Build:  make image           (ci/build_image.py: hermetic, from a wheelhouse prepared on the host)
#         docker build .       (also works where pip inside a container can reach the package index)
# Run:    docker run --rm -e VARIANT=native -e SCALE=smoke IMAGE
#         docker run --rm IMAGE --help          (the environment table)
# Classic builder only (the docker SDK uses it): no BuildKit syntax such as RUN --mount.
#
# Layers go from slowest- to fastest-changing: the packages (their own stage), the user and the
# data paths, then entrypoint/ and recipes/, so a code change rebuilds in seconds and reinstalls
# nothing. No secret, token or CA file is needed or added: the hermetic build never touches the
# network, and the image build is given none (network mode "none").

# The Neuron SDK 2.33 PyTorch training DLC (torch 2.14.0 + torch-neuronx 2.14.3, Python 3.14, Ubuntu
# 26.04). The tag follows the DLC tag scheme but is UNCONFIRMED: see ci/README.md to check it and
# to pin it by digest. CI builds on a stand-in (ci/standin/) with BASE_IMAGE=neuron-qwen3-standin:...
ARG BASE_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:2.14.0-neuronx-py314-sdk2.33.0-ubuntu26.04
# pypi (supported): torchtitan 0.3.0 from requirements.lock. neuron: the aws-neuron/torchtitan-neuron fork at
# TORCHTITAN_NEURON_REF, a 40-hex commit (a branch is refused), installed over it (its wheel cannot be fetched in
# CI: this seam is untested; the config check below fails the build if the recipes do not fit it).
ARG TORCHTITAN=pypi
ARG TORCHTITAN_NEURON_REF=

# ---- packages: what the image adds on top of the base, in a venv that sees the base's packages ---
FROM ${BASE_IMAGE} AS packages
# 1: install only from the wheels of .wheelhouse/ (make image prepares them); 0: from the index.
ARG PIP_OFFLINE=0
ARG TORCHTITAN
ARG TORCHTITAN_NEURON_REF
ENV VENV=/opt/neuron-qwen3/venv
# .wheelhouse* may match nothing (an online build): the other sources always match.
COPY requirements.lock requirements-torch.lock ci/image/install-packages.sh ci/image/import-check.py .wheelhouse* \
     /tmp/packages/
RUN sh /tmp/packages/install-packages.sh

# ---- the image ------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
# The DLC's leftover health check probes a server on port 8080 that a training job never starts.
HEALTHCHECK NONE

# Data paths, meant to be mounted (the launcher's contract, entrypoint/contract.py):
#   ASSETS_DIR  model assets, one folder per Hub repo (`hf download --local-dir`)
#   OUTPUT_DIR  logs, traces (torchtitan's --dump_folder)
#   /data/checkpoints  for CHECKPOINT_DIR, which the launcher leaves unset (no checkpoints) unless given:
#               docker run -e CHECKPOINT_DIR=/data/checkpoints -v ckpt:/data/checkpoints ...
#   CACHE_DIR   compile caches (Neuron NEFF/HLO/NKI, inductor) and the Hugging Face cache: mount it,
#               or every container recompiles for minutes on its first steps
# No VOLUME instruction: an anonymous volume keeps nothing between runs and piles up on the host.
ENV ASSETS_DIR=/data/assets \
    OUTPUT_DIR=/data/outputs \
    CACHE_DIR=/data/cache \
    HF_HOME=/data/cache/huggingface \
    PATH=/opt/neuron-qwen3/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1

# A non-root user (uid 10001, group 10001) owns the data paths and runs the launcher. The Neuron
# driver's device nodes are usually world read-write; where a host's are not, run with
# `--group-add <gid of /dev/neuron0>` or `--user 0` (ci/README.md).
ARG APP_UID=10001
RUN useradd --no-log-init --uid "${APP_UID}" --user-group --create-home --home-dir /home/trainer trainer \
 && mkdir -p /data/assets /data/outputs /data/cache /data/checkpoints \
 && chown -R "${APP_UID}:${APP_UID}" /data

COPY --from=packages /opt/neuron-qwen3/venv /opt/neuron-qwen3/venv

WORKDIR /opt/neuron-qwen3
# The launcher's preflight checks the installed torch/torchtitan/transformers against these.
COPY requirements.lock requirements-torch.lock ./
COPY ci/image/code-check.py ci/image/config-check.py ci/image/record-build.py tools/
COPY pyproject.toml ./
COPY entrypoint/ entrypoint/
COPY recipes/ recipes/
# Install this project into the venv, editable (its sources stay here, where the launcher finds the locks), with the
# image's revision as the local version label that each run's summary.json records (0.4.0+<revision>); byte-compile
# the code (the user cannot write __pycache__ here), check that every package it imports is installed (without
# importing torch), build every config function on this image's torchtitan (either TORCHTITAN: a torchtitan the
# recipes do not fit fails `make image`, not the first run; offline, no device, throwaway HOME and HF_HOME), record
# what the image was built with for the launcher's preflight (image-build.lock: a LABEL is not visible inside the
# container), and check that the launcher starts and that the article's `-m torchtitan.train --module neuron_qwen3`
# finds the recipes from any directory.
ARG TORCHTITAN
ARG VCS_REF=unknown
RUN sed -i "s/^version = \"\(.*\)\"$/version = \"\1+$(echo "${VCS_REF}" | tr -c 'a-zA-Z0-9.\n' .)\"/" pyproject.toml \
 && python3 -m pip install --disable-pip-version-check --no-cache-dir --no-index --no-deps --no-build-isolation \
    --quiet -e . \
 && python3 -m compileall -q entrypoint recipes \
 && python3 tools/code-check.py entrypoint recipes \
 && HOME=/tmp/config-check HF_HOME=/tmp/config-check HF_HUB_OFFLINE=1 python3 tools/config-check.py \
 && rm -rf /tmp/config-check \
 && python3 tools/record-build.py "${TORCHTITAN}" >image-build.lock \
 && (cd / && python3 -c "import neuron_qwen3.config_registry, entrypoint.cli") \
 && python3 -m entrypoint --list

USER ${APP_UID}

# Last, so that a new date or version only rewrites metadata. ci/build_image.py passes each one.
ARG BASE_IMAGE
ARG TORCHTITAN_NEURON_REF
ARG BUILD_DATE=unknown
ARG TORCHTITAN_VERSION=0.3.0
ARG TRANSFORMERS_VERSION=5.16.0
ARG TORCH_VERSION=unknown
ARG NEURON_SDK=2.33.0
LABEL org.opencontainers.image.title="neuron-qwen3" \
      org.opencontainers.image.description="Train Qwen3 with torchtitan on AWS Trainium: v5, native and nki_moe variants" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.version="torchtitan${TORCHTITAN_VERSION}-transformers${TRANSFORMERS_VERSION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.neuron-qwen3.torchtitan="${TORCHTITAN}" \
      io.neuron-qwen3.torchtitan.version="${TORCHTITAN_VERSION}" \
      io.neuron-qwen3.torchtitan-neuron.ref="${TORCHTITAN_NEURON_REF}" \
      io.neuron-qwen3.transformers.version="${TRANSFORMERS_VERSION}" \
      io.neuron-qwen3.torch.version="${TORCH_VERSION}" \
      io.neuron-qwen3.neuron-sdk="${NEURON_SDK}"

ENTRYPOINT ["python3", "-m", "entrypoint"]
