# multicard on the NGC PyTorch image: the image's own CUDA, PyTorch, DALI and Nsight Systems are
# what gets measured, so nothing here reinstalls torch. Build:  docker build -t multicard .
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:24.11-py3
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="multicard" \
      org.opencontainers.image.description="Reproducibility artifact for arXiv 2505.22905" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV MULTICARD_IN_CONTAINER=1 \
    PYTHONNOUSERSITE=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /opt/multicard
COPY pyproject.toml README.md noxfile.py ./
COPY src ./src
COPY experiments ./experiments
COPY data ./data
RUN python -m pip install --no-cache-dir . nox==2026.10.20

CMD ["nox", "-l"]
