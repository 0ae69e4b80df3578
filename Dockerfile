# multicard on NVIDIA's NGC PyTorch image: the image's own CUDA, PyTorch, DALI and Nsight Systems
# are what gets measured, so torch is never reinstalled. Base and pins: requirements/image.toml,
# requirements/container.txt (one source for this file and apptainer.def).
#   docker build -t multicard .
#   docker build --build-arg BASE_DIGEST=@sha256:<digest> -t multicard .   # pin the base by digest
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:24.11-py3
ARG BASE_DIGEST=
FROM ${BASE_IMAGE}${BASE_DIGEST}

ARG BASE_IMAGE
ARG BASE_DIGEST
ARG MULTICARD_GIT_SHA=unknown
# what requirements/check_image.py expects of the base (containers/standin/ has the stand-in's)
ARG EXPECTED_VERSIONS=requirements/image.toml
LABEL org.opencontainers.image.title="multicard" \
      org.opencontainers.image.description="Reproducibility artifact for arXiv 2505.22905: repeated, verifiable re-runs of its experiments" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${MULTICARD_GIT_SHA}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}${BASE_DIGEST}"

ENV MULTICARD_IN_CONTAINER=1 \
    MULTICARD_IMAGE="multicard:0.1.0 on ${BASE_IMAGE}${BASE_DIGEST}" \
    MULTICARD_GIT_SHA="${MULTICARD_GIT_SHA}" \
    MULTICARD_DATA_DIR=/opt/multicard/data \
    MULTICARD_CLAIMS=/opt/multicard/experiments/claims.toml \
    MULTICARD_CACHE_DIR=/opt/multicard/artifact/cache \
    PYTHONNOUSERSITE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# numactl: the NUMA experiments start ranks under it. Its version follows the pinned base image's
# Ubuntu release (hadolint DL3008 is ignored for that reason; env.json records what ran).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends numactl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/multicard
COPY requirements/ requirements/
RUN python -m pip install --no-deps --require-hashes -r requirements/container.txt

COPY pyproject.toml README.md ARTIFACT.md LICENSE CITATION.cff noxfile.py ./
COPY docs/ docs/
COPY src/ src/
COPY experiments/ experiments/
COPY data/mnist/ data/mnist/
COPY benchmarks/ benchmarks/
RUN python -m pip install --no-deps --no-build-isolation . \
 && python requirements/check_image.py "${EXPECTED_VERSIONS}" \
 && python -m multicard data verify

# A non-root user owns what runs write: artifact/ (mount a host folder there), which also holds
# what multicard prepares from the shipped data (artifact/cache: Scenario B trees, LLM assets), so
# the image runs with a read-only root.
RUN useradd --create-home --shell /bin/bash --uid 1001 --user-group multicard \
 && mkdir -p artifact/runs \
 && chown -R 1001:1001 artifact data
USER 1001:1001

CMD ["sh", "-c", "echo 'multicard: docker run --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 -v \"$PWD/artifact:/opt/multicard/artifact\" multicard nox -s <session>'; nox -l"]
