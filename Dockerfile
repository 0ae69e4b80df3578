# multicard on NVIDIA's NGC PyTorch image: the image's own CUDA, PyTorch, DALI and Nsight Systems
# are what gets measured, so torch is never reinstalled, and the lock adds packages (it replaces
# one of the base's, with the reason in requirements/lock.py). Base and pins: requirements/image.toml,
# requirements/container.txt (one source for this file and apptainer.def).
# Build with containers/build.sh (it passes the base's digest, the git commit and the date), or:
#   docker build --build-arg MULTICARD_GIT_SHA="$(git rev-parse HEAD)" -t multicard .
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:24.11-py3
# the base's digest (sha256:...): containers/build.sh reads it from the pulled base
ARG BASE_DIGEST=
FROM ${BASE_IMAGE}${BASE_DIGEST:+@}${BASE_DIGEST}

ARG BASE_IMAGE
ARG BASE_DIGEST
# what requirements/check_image.py expects of the base (containers/standin/ has the stand-in's)
ARG EXPECTED_VERSIONS=requirements/image.toml
LABEL org.opencontainers.image.title="multicard" \
      org.opencontainers.image.description="Reproducibility artifact for arXiv 2505.22905: repeated, verifiable re-runs of its experiments" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

# every env.json records these (MULTICARD_BASE_DIGEST empty: the base was not pinned by digest)
ENV MULTICARD_IN_CONTAINER=1 \
    MULTICARD_IMAGE="multicard:0.1.0 on ${BASE_IMAGE}" \
    MULTICARD_BASE_DIGEST="${BASE_DIGEST}" \
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
# only the lock before the pip layer: an edit to the sources does not reinstall the packages.
# `pip check` of the base first: the build fails on any problem the lock adds to it.
COPY requirements/container.txt requirements/
RUN { python -m pip check > /opt/multicard/base-pip-check.txt || true; } \
 && python -m pip install --no-deps --require-hashes -r requirements/container.txt

COPY pyproject.toml README.md ARTIFACT.md LICENSE CITATION.cff noxfile.py ./
COPY docs/ docs/
COPY requirements/ requirements/
COPY src/ src/
COPY experiments/ experiments/
COPY data/mnist/ data/mnist/
COPY benchmarks/ benchmarks/
COPY containers/entrypoint.sh /usr/local/bin/multicard-entrypoint
RUN python -m pip install --no-deps --no-build-isolation . \
 && python requirements/check_image.py "${EXPECTED_VERSIONS}" /opt/multicard/base-pip-check.txt \
 && python -m multicard data verify

# What runs write goes to artifact/ (mount a host folder there; it also holds what multicard
# prepares from the shipped data, artifact/cache), so the image runs with a read-only root, as any
# uid: `--user "$(id -u):$(id -g)"` makes the host folder's owner the writer. uid 1001 is the
# default; the entry point gives any uid a HOME and says how to fix an artifact/ it cannot write.
RUN useradd --create-home --shell /bin/bash --uid 1001 --user-group multicard \
 && install -d -o 1001 -g 1001 artifact artifact/runs
USER 1001:1001

# the commit, source and date last: they change with every build, and a layer after them would
# be rebuilt each time (containers/build.sh passes them)
ARG MULTICARD_GIT_SHA=unknown
ARG MULTICARD_CREATED=unknown
ARG MULTICARD_SOURCE=unknown
LABEL org.opencontainers.image.created="${MULTICARD_CREATED}" \
      org.opencontainers.image.source="${MULTICARD_SOURCE}" \
      org.opencontainers.image.revision="${MULTICARD_GIT_SHA}"
ENV MULTICARD_GIT_SHA="${MULTICARD_GIT_SHA}" \
    MULTICARD_IMAGE_CREATED="${MULTICARD_CREATED}" \
    MULTICARD_IMAGE_SOURCE="${MULTICARD_SOURCE}"

ENTRYPOINT ["multicard-entrypoint"]
CMD ["sh", "-c", "echo 'multicard: docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 --user \"$(id -u):$(id -g)\" -v \"$PWD/artifact:/opt/multicard/artifact\" multicard nox -s <session>'; nox -l"]
