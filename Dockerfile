# The controller image: `docker build -t mpijob-elastic:latest .`
# BASE_IMAGE is any Debian-like Python 3.11 image with pip; the official one by default.
# Machines without a registry pass a locally made one (hack/images.sh, docs/kind.md).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY mpijob_elastic ./mpijob_elastic
# A regular (non-editable) install, so the sources can go and the image keeps only the package.
RUN pip install . && rm -rf /src

# The same numeric user the Deployment's runAsUser names, so runAsNonRoot can verify it.
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin mpijob-elastic
USER 65532:65532
WORKDIR /

ENTRYPOINT ["mpijob-elastic"]
