# syntax=docker/dockerfile:1
#
# kafka-quota-proxy image. Build from the repository root:  docker build -t kafka-quota-proxy .
#
# Ports (the defaults of kafka_quota_proxy/config/settings.py; publish the ones your config actually uses):
#   9092        bootstrap listener                     (`listen`, default 0.0.0.0:9092)
#   9093-9099   one listener per broker: node_port(id) = node_port_base + id, where
#               node_port_base defaults to the listen port + 1, so broker ids 0..6 -> 9093..9099.
#               Brokers with other ids need a different node_port_base or `node_ports` pins.
#   9404        Prometheus metrics at /metrics         (`metrics`; off unless configured)
#
# No HEALTHCHECK here: the only HTTP endpoint is /metrics, which exists only when `metrics` is set.
# docker-compose.yml defines a health check against it for the demo.

# ---- builder: build the project wheel and wheels of all its dependencies -------------------------
FROM python:3.12-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kafka_quota_proxy/ kafka_quota_proxy/
RUN pip wheel --wheel-dir /wheels .

# ---- runtime: install the wheels only, run as an unprivileged user --------------------------------
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted from the builder stage, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels kafka-quota-proxy
RUN groupadd --system --gid 10001 kqp \
    && useradd --system --uid 10001 --gid kqp --no-create-home --shell /usr/sbin/nologin kqp
USER 10001:10001
EXPOSE 9092 9093-9099 9404
# SIGTERM makes the proxy stop accepting, drain in-flight requests for up to
# shutdown_timeout_seconds (default 30), then exit: give it a longer stop timeout than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["kafka-quota-proxy"]
# Conventional config location, used by docker-compose.yml and deploy/kubernetes/sidecar.yaml.
CMD ["--config", "/etc/kafka-quota-proxy/proxy.yaml"]
