# syntax=docker/dockerfile:1
# The admission-policy operator image. Build: docker build -t admission-policy-operator .
# The same image runs the operator (ENTRYPOINT) and the chart's uninstall cleanup Job
# (command: admission-policy cleanup-webhooks --name NAME).

# ---- builder: build the project's wheel and install it with its runtime dependencies into a venv
FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
WORKDIR /src

# Only what the wheel is built from (see .dockerignore): no tests, charts, examples or benches.
COPY pyproject.toml README.md ./
COPY operator/ ./operator/

RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install /wheels/*.whl \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
 && /opt/venv/bin/pip uninstall --yes pip setuptools wheel \
 && /opt/venv/bin/admission-policy --help > /dev/null

# ---- runtime: the venv only, as an unprivileged user
FROM python:3.11-slim

LABEL org.opencontainers.image.title="admission-policy-operator" \
      org.opencontainers.image.description="Kubernetes admission policies in CEL, enforced by a Kopf operator" \
      org.opencontainers.image.licenses="Apache-2.0"

# Not "operator": Debian's base-passwd already has that group (gid 37), and groupadd refuses it.
# No pip at run time either: the image installs nothing once built.
RUN groupadd --system --gid 10001 apo \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
            --shell /usr/sbin/nologin apo \
 && python -c "import os, pip, shutil; shutil.rmtree(os.path.dirname(pip.__file__))" \
 && rm -f /usr/local/bin/pip* /usr/bin/pip*

COPY --from=builder /opt/venv /opt/venv

# The root filesystem is mounted read-only in the cluster; /tmp is an emptyDir (certificates
# in AP_CERT_DIR, anything that insists on a home directory).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp

USER 10001:10001
WORKDIR /tmp

# webhook (HTTPS), metrics (HTTP /metrics), health (HTTP /healthz, /readyz)
EXPOSE 9443 8080 8081

ENTRYPOINT ["admission-policy", "run"]
