# Headrace operator image: `python -m headrace_operator` (kopf), non-root.
# Build from the repository root:  docker build -t headrace-operator .

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/headrace
COPY pyproject.toml README.md ./
COPY headrace ./headrace
COPY operator ./operator
COPY spark_apps ./spark_apps
RUN /opt/headrace/bin/pip install ".[operator]" \
    && /opt/headrace/bin/python -c "import headrace_operator.handlers"

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="headrace-operator" \
      org.opencontainers.image.description="Kubernetes operator for Headrace streaming clusters"
RUN groupadd --system --gid 10001 headrace \
    && useradd --system --uid 10001 --gid headrace --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin headrace
COPY --from=build /opt/headrace /opt/headrace
ENV PATH=/opt/headrace/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["python", "-m", "headrace_operator"]
CMD ["--liveness=http://0.0.0.0:8080/healthz"]
