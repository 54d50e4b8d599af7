# The controller image: `docker build -t mpijob-elastic:latest .`
# BASE_IMAGE is any Debian-like Python 3.11 image with pip. The default is the official
# python:3.11-slim pinned by digest, so a rebuild gets the same base until someone moves
# the pin on purpose (README, "Installing", says how). The machine this was written on
# has no registry access, so this digest (an index digest of python:3.11-slim found in
# public build files) was not pulled here: `docker buildx imagetools inspect
# python:3.11-slim` shows the current one. Machines without a registry pass a locally
# made base instead (hack/images.sh, docs/kind.md).
ARG BASE_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The locked versions first, each checked against its hash (setuptools too, which builds
# the package below); then the package itself without dependencies and without fetching
# build tools, so nothing unpinned enters the image. `make venv` installs the same way.
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY mpijob_elastic ./mpijob_elastic
# A regular (non-editable) install, so the sources can go and the image keeps only the package.
RUN pip install --no-deps --no-build-isolation . && rm -rf /src

# The commit the image is built from, for `mpijob-elastic --version` and the
# mpijob_elastic_build_info metric (app/build.py); empty when the build does not say. Last,
# so a new commit rebuilds no layer above.
ARG COMMIT=""
ENV MPIJOB_ELASTIC_COMMIT=${COMMIT}

# The same numeric user the Deployment's runAsUser names, so runAsNonRoot can verify it.
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin mpijob-elastic
USER 65532:65532
WORKDIR /

ENTRYPOINT ["mpijob-elastic"]
