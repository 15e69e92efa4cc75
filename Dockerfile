# ha-controller image: `hactl` for nameservers, brokers and the client tools.
#   docker build -t ha-controller:0.1.0 .
#   docker run --rm ha-controller:0.1.0 nameserver
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package build needs (see .dockerignore); the generated
# protobuf modules are committed, so no protoc at build time.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ha_controller/ ha_controller/
COPY nameserver/ nameserver/
COPY broker_agent/ broker_agent/
RUN pip install '.[uvloop]' \
 && rm -rf /src

# Non-root, fixed ids: the Helm chart runs as 10001 with fsGroup 10001 so the
# store volume (/data) is writable.
RUN groupadd --system --gid 10001 hac \
 && useradd --system --uid 10001 --gid hac --home-dir /home/hac --create-home --shell /usr/sbin/nologin hac \
 && mkdir -p /data \
 && chown hac:hac /data
USER 10001:10001
WORKDIR /home/hac

# nameserver RPC / HTTP, broker RPC / HA / HTTP (docs/architecture.md, "Processes and ports")
EXPOSE 9876 9877 10911 10912 10913
VOLUME ["/data"]

ENTRYPOINT ["hactl"]
CMD ["--help"]
