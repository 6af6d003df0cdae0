# syntax=docker/dockerfile:1
#
# nvgpu-exporter image. No CUDA inside: libnvidia-ml.so and the /dev/nvidia* nodes come from the
# host through the NVIDIA container runtime, which acts on NVIDIA_VISIBLE_DEVICES and
# NVIDIA_DRIVER_CAPABILITIES below.
#
# One platform (a plain image manifest, which older registry sync jobs can copy):
#
#   docker buildx build --platform linux/amd64 --provenance=false --sbom=false \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" --build-arg SOURCE=<repository URL> \
#     -t registry.example.com/platform/nvgpu-exporter:0.1.0 --push .
#
# amd64 and arm64 (Grace Hopper GH200 nodes) in one tag (an image index):
#
#   docker run --privileged --rm tonistiigi/binfmt --install arm64    # once per build host
#   docker buildx create --use --name multi                             # a builder that can emulate
#   docker buildx build --platform linux/amd64,linux/arm64 --provenance=false --sbom=false \
#     --build-arg VERSION=0.1.0 ... -t registry.example.com/platform/nvgpu-exporter:0.1.0 --push .
#
# Both stages run on the target platform (arm64 under QEMU on an amd64 host): `pip wheel` then only
# downloads, since every dependency publishes manylinux wheels for x86_64 and aarch64
# (tests/test_dockerfile.py checks it), and the strict self-check at the end runs in the image it
# checks, for each platform. (--provenance=false --sbom=false: no attestation manifests; see
# docs/kubernetes.md, "Building the image".)
#
# The install steps below are reproduced in CI in a fresh virtual environment by
# tests/test_dockerfile.py (build the wheelhouse, install from it alone, self-check from /).
# Keep the two in step: that test also checks these lines are present here.

ARG PYTHON_IMAGE=python:3.12-slim

# ---------------------------------------------------------------------------------------------
# builder: a wheel of the project plus wheels of every runtime dependency (with the kubernetes
# extra for pod attribution). Only this stage sees the source tree.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# .dockerignore admits only pyproject.toml, README/LICENSE, exporter/ and guards/.
COPY . .
# The commit and the build time, baked into the package for `nvgpu-exporter --version`
# (exporter/buildinfo.py); release/release.py passes both.
ARG REVISION=unknown
ARG CREATED=unknown
RUN python -c 'import sys; from exporter.buildinfo import write; write(sys.argv[1], sys.argv[2])' "${REVISION}" "${CREATED}"
# (kept apart: tests/test_dockerfile.py replays the wheel step as written)
# hadolint ignore=DL3059
RUN pip wheel --wheel-dir /wheels ".[kubernetes,fast]"

# ---------------------------------------------------------------------------------------------
# runtime: the installed wheel and nothing else of the source.
FROM ${PYTHON_IMAGE}

# Default = exporter.__version__ (tests/test_dockerfile.py keeps them equal).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="nvgpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs that keeps serving when NVML crashes, hangs or drifts" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="docker.io/library/python:3.12-slim"

# NVIDIA container runtime: expose every GPU of the node (the exporter watches all of them,
# whatever pods hold them) with the management library only (utility = nvidia-smi + NVML),
# no compute/graphics libraries.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Install from the builder's wheelhouse only (--no-index): what was built is what runs, and the
# pin makes the build fail when VERSION (the label) is not the version of the wheel. The wheels
# are bind-mounted, so they leave no layer behind.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "nvgpu-exporter[kubernetes,fast]==${VERSION}"

# The incident: the working directory held an old copy of the package, and Python imported that
# instead of the installed one. / holds no source, and the self-check proves which files run.
WORKDIR /

# Numeric uid/gid so runAsNonRoot can verify it without an /etc/passwd lookup.
USER 65532:65532

# Fails the build if what Python imports is not the installed wheel (shadowing, version drift).
# Needs no GPU: the build machine has none, and NVML results are reported, not required, here.
RUN nvgpu-exporter selfcheck --strict

EXPOSE 19400
ENTRYPOINT ["nvgpu-exporter"]
