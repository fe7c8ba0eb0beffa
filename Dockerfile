FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml ./
COPY busd ./busd
RUN pip install . && rm -rf /src

# Runs unprivileged; /data holds the embedded store when no --redis-url is given.
RUN useradd --system --create-home --uid 10001 busd \
    && mkdir -p /data \
    && chown busd /data
USER busd
WORKDIR /home/busd
ENV BUSD_DATA_DIR=/data
VOLUME ["/data"]

# AMQP, then health/metrics/admin over HTTP
EXPOSE 5672 5300
CMD ["busd", "serve", "--host", "0.0.0.0"]
