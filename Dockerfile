# syntax=docker/dockerfile:1.7
#
# mtserve container images. Four stages:
#
#   build  python:3.11-slim + torch (CPU wheel): exports the shipped weights in
#          the shipped models (models/default: en→de, models/de-en) to ONNX and builds the
#          mtserve wheel. Never shipped.
#   models the build stage as a tool: `python -m service models pull|sync|update|list|remove`
#          into the models volume (it needs torch to export a pull; never serves). (--target models)
#   gpu    NVIDIA CUDA 13 + cuDNN 9 runtime, Python 3.11, onnxruntime-gpu.   (--target gpu)
#   cpu    python:3.11-slim, onnxruntime.                                    (--target cpu)
#
# Neither runtime image contains torch or onnx (docs/design.md, decision 5), and each holds exactly
# one ONNX Runtime distribution: `onnxruntime` and `onnxruntime-gpu` both install the
# `onnxruntime` module, so installing one over the other breaks it.
#
#   docker build --target gpu -t mtserve:gpu .
#   docker build --target cpu -t mtserve:cpu .
#
# Needs BuildKit (the default builder since Docker 23) for RUN --mount and COPY --chmod.

# --- Versions: change them here, and together -----------------------------------------------
# ONNX Runtime 1.27-1.31 wheels on PyPI are built for CUDA 13 / cuDNN 9 (1.22-1.26: CUDA 12).
# 1.31.1 is the version the CPU test suite runs against, so the CPU and GPU images serve the
# graphs with the same ORT release. If you move ORT_VERSION below 1.27, CUDA_IMAGE must move
# to a 12.x image (tests/deploy/test_deployment.py checks the pairing).
ARG ORT_VERSION=1.31.1
# CUDA 13.0 is the oldest CUDA 13 (widest driver support: R580+). CUDA minor-version
# compatibility lets ORT builds made with any 13.x toolkit run on it. The -cudnn- runtime
# flavour ships cuDNN 9 and the runtime libraries ORT's CUDA provider dlopens (cudart,
# cublas/cublasLt, cufft, curand), without compilers or headers.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
# Debian-based Python image for the build and CPU stages (manylinux wheels need glibc).
ARG PYTHON_IMAGE=python:3.11-slim-trixie
ARG TORCH_VERSION=2.13.0
# uv provides a relocatable CPython 3.11 on the Ubuntu-based CUDA image (Ubuntu 24.04 ships
# 3.12 only) and installs the runtime dependencies. Pinning uv pins the CPython patch release
# it downloads. It is bind-mounted, never copied, so it is not in the runtime images.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

# =============================================================================================
# build: export the shipped PyTorch weights to ONNX (torch lives only here)
# =============================================================================================
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src

# torch first, from the CPU index: a torch requirement resolved from PyPI later would pull
# the multi-GB CUDA build, and the export does not need a GPU.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \
        "torch==${TORCH_VERSION}"

# Runtime + export dependencies, read from pyproject.toml so this layer is rebuilt only when
# the dependency list changes, not on every source edit. constraints.txt keeps torch pinned.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['export']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt

COPY README.md ./
COPY models/ models/
COPY export/ export/
COPY service/ service/

# /export/<model>: the ONNX graphs, config and tokenizer files the runtime loads, one directory
# per shipped model (MT_EXPORTS serves them all, routed by language pair). /dist: the project as a wheel, installed with --no-deps in the runtime
# stages (their dependency set is docker/requirements-runtime.txt plus the matching ORT).
RUN python -m export --model models/default --output /export/default \
 && python -m export --model models/de-en --output /export/de-en \
 && pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# =============================================================================================
# models: pulls models by name into /models/pulled, which the runtime images serve
# (MT_MODELS_DIR); the Hugging Face cache is its own volume at HF_HOME (docs/models.md)
# =============================================================================================
FROM build AS models
RUN useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin mtserve \
 && install -d -o 10001 -g 10001 -m 0750 /models/pulled /var/cache/huggingface
ENV MT_MODELS_DIR=/models/pulled \
    HF_HOME=/var/cache/huggingface
USER 10001:10001
CMD ["python", "-m", "service", "models", "list"]

# =============================================================================================
# gpu: CUDA + cuDNN runtime, onnxruntime-gpu
# =============================================================================================
FROM ${CUDA_IMAGE} AS gpu
ARG ORT_VERSION
LABEL org.opencontainers.image.title="mtserve (GPU)" \
      org.opencontainers.image.description="Machine-translation inference service: ONNX Runtime CUDA, continuous batching" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_NO_CACHE=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Python 3.11 (uv's standalone build) in /opt/python, a venv in /opt/venv, the pinned runtime
# set + onnxruntime-gpu, then the project wheel without dependencies. Bytecode is compiled
# now because the container runs with a read-only root filesystem.
RUN --mount=type=bind,from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=bind,from=build,source=/dist,target=/tmp/dist \
    --mount=type=bind,source=docker/requirements-runtime.txt,target=/tmp/requirements-runtime.txt \
    uv python install 3.11 \
 && uv venv --python 3.11 /opt/venv \
 && uv pip install --compile-bytecode -r /tmp/requirements-runtime.txt "onnxruntime-gpu==${ORT_VERSION}" \
 && uv pip install --compile-bytecode --no-deps /tmp/dist/*.whl \
 && useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin mtserve

# Fail the build, not the deployment, if the image breaks the runtime rules.
RUN --mount=type=bind,source=docker/verify_runtime.py,target=/tmp/verify_runtime.py \
    python /tmp/verify_runtime.py --flavour gpu

COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/mt-healthcheck
# The exported shipped models (en→de, de→en), both served (MT_EXPORTS). Serve another one
# by mounting its export directory (read-only) and setting MT_EXPORTS to it (or adding it to
# MT_EXPORTS to serve it beside them); the models are no VOLUME, because a
# VOLUME would copy them into a stray anonymous volume on every `docker run`. Models pulled by
# name (the models image) are served from /models/pulled (MT_MODELS_DIR), empty unless a
# volume is mounted there; one of them replaces a shipped model of its pair.
# The GPU image serves the fp32 exports: on an H100 the fp16 variant was at most 1.2x faster per
# step (the step's time is the host's, not the kernels') and changed 0.4 % of translations
# (BENCHMARKS.md § GPU). ORT_VERSION 1.31.1 over CUDA 13.0 + cuDNN 9 is the pairing that ran
# there (driver 580).
COPY --from=build /export/default /models/default
COPY --from=build /export/de-en /models/de-en

# provider=cuda: the GPU image refuses to start on CPU (e.g. `--gpus` forgotten) instead of
# silently serving at a fraction of the throughput; set MT_PROVIDER=auto to allow fallback.
ENV MT_EXPORTS=/models/default,/models/de-en \
    MT_PROVIDER=cuda \
    MT_HOST=0.0.0.0 \
    MT_PORT=8000 \
    MT_DATA_DIR=/var/lib/mtserve \
    MT_MODELS_DIR=/models/pulled

# Stored glossaries, memories and document jobs: the one place the server writes. It belongs
# to the server's user and is a declared volume, so it survives the container and stays
# writable under a read-only root filesystem (compose and Kubernetes mount one there).
RUN install -d -o 10001 -g 10001 -m 0750 /var/lib/mtserve /models/pulled
VOLUME ["/var/lib/mtserve"]

WORKDIR /srv/mtserve
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8000
# uvicorn drains in-flight requests on SIGTERM (MT_SHUTDOWN_GRACE_S).
STOPSIGNAL SIGTERM
# Liveness only: /ready (model warmed up) is what load balancers and compose wait for.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["mt-healthcheck", "/health"]
CMD ["python", "-m", "service"]

# =============================================================================================
# cpu: python:3.11-slim, onnxruntime (CPU build)
# =============================================================================================
FROM ${PYTHON_IMAGE} AS cpu
ARG ORT_VERSION
LABEL org.opencontainers.image.title="mtserve (CPU)" \
      org.opencontainers.image.description="Machine-translation inference service: ONNX Runtime CPU, continuous batching" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Same install as the GPU stage, on the image's own CPython 3.11, with the CPU ORT build.
RUN --mount=type=bind,from=uv,source=/uv,target=/usr/local/bin/uv \
    --mount=type=bind,from=build,source=/dist,target=/tmp/dist \
    --mount=type=bind,source=docker/requirements-runtime.txt,target=/tmp/requirements-runtime.txt \
    uv venv --python /usr/local/bin/python3.11 /opt/venv \
 && uv pip install --compile-bytecode -r /tmp/requirements-runtime.txt "onnxruntime==${ORT_VERSION}" \
 && uv pip install --compile-bytecode --no-deps /tmp/dist/*.whl \
 && useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin mtserve

RUN --mount=type=bind,source=docker/verify_runtime.py,target=/tmp/verify_runtime.py \
    python /tmp/verify_runtime.py --flavour cpu

COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/mt-healthcheck
COPY --from=build /export/default /models/default
COPY --from=build /export/de-en /models/de-en

ENV MT_EXPORTS=/models/default,/models/de-en \
    MT_PROVIDER=cpu \
    MT_HOST=0.0.0.0 \
    MT_PORT=8000 \
    MT_DATA_DIR=/var/lib/mtserve \
    MT_MODELS_DIR=/models/pulled

RUN install -d -o 10001 -g 10001 -m 0750 /var/lib/mtserve /models/pulled
VOLUME ["/var/lib/mtserve"]

WORKDIR /srv/mtserve
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["mt-healthcheck", "/health"]
CMD ["python", "-m", "service"]
