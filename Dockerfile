# python-qpid-proton ships as source only: build every wheel in a stage with a compiler,
# then install the wheels in a slim image that has no build tools.
FROM python:3.13-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential libssl-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml ./
COPY busd ./busd
# The build sees no git metadata, so the version comes from here (docs/operating.md#upgrades):
# `docker build --build-arg BUSD_VERSION=0.3.0 .`; without it, pyproject.toml's fallback.
ARG BUSD_VERSION=0.0
RUN SETUPTOOLS_SCM_PRETEND_VERSION_FOR_BUSD="$BUSD_VERSION" \
    pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.13-slim
# jemalloc: the embedded Valkey runs with it when present (busd/storage/redis/embedded.py)
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install --no-index --find-links=/wheels busd && rm -rf /wheels

# Runs unprivileged; /data holds the embedded store when no --redis-url is given.
RUN useradd --system --create-home --uid 10001 busd \
    && mkdir -p /data \
    && chown busd /data
USER busd
WORKDIR /home/busd
ENV BUSD_DATA_DIR=/data
VOLUME ["/data"]

# AMQP (HTTP and HTTPS answered on it too), AMQP over TLS, AMQP over WebSockets (ws and wss),
# then the emulator's HTTP port: /health, metrics, admin, the management API
EXPOSE 5672 5671 5443 5300
# compose.yaml's health test, so that `docker run` and compose files without one (the
# emulator's) get it too. The slim image has no curl: python's urllib fails on anything but
# 200 (store down: 503). Podman keeps it only in the docker format (`--format docker`).
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5300/health', timeout=2)"]
# One worker process per core the container may use, all on the same ports. Without
# --redis-url the store is embedded in /data; `--store-shards auto` (or BUSD_STORE_SHARDS=auto)
# runs it as a local Cluster of one shard per two cores, each in /data/shard-<i>, with new
# entities partitioned over them (docs/design.md §3.9).
CMD ["busd", "serve", "--host", "0.0.0.0", "--workers", "auto"]
