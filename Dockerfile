# syntax=docker/dockerfile:1
# bucketq: one image for `bucketq operator`, `bucketq sidecar` and the rest of the CLI.
#
#   docker build -t ghcr.io/bucketq/bucketq:0.1.0 .      (or: make image)
#
# Stage 1 builds the wheel and installs it with the pinned runtime dependencies of
# requirements/image.txt (regenerate with `make lock`) into a virtualenv at /opt/bucketq.
# Stage 2 is the same slim Python base with only that virtualenv copied in: no compilers,
# no build frontends, no sources, and it runs as an unprivileged numeric user.

# Pinned base (same interpreter in both stages, so the virtualenv's paths stay valid), by digest:
# a tag can be re-pushed, a digest cannot. The digest is the tag python:3.11.13-slim-bookworm as
# recorded by other projects' pinned Dockerfiles; to move on, update tag and digest together, from
#   docker buildx imagetools inspect python:<tag> --format '{{json .Manifest.Digest}}'
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements/image.txt requirements/build.txt requirements/
# The wheel's build backend, pinned like everything else; it only lives in this stage.
# --require-hashes: every downloaded file must match a sha256 of the lock (a re-uploaded or
# tampered file fails the build), and every requirement must be pinned with its hashes.
RUN python -m pip install --require-hashes --no-deps -r requirements/build.txt
# Dependencies first: this layer is reused until the lock changes.
RUN python -m venv --without-pip /opt/bucketq \
 && python -m pip --python /opt/bucketq/bin/python install --require-hashes --no-deps -r requirements/image.txt
COPY pyproject.toml README.md ./
COPY bucketq ./bucketq
# The wheel with the extras the image serves (requirements/lock.py IMAGE_EXTRAS). --no-index: every
# dependency, the extras' included, must already be there from the lock, or this step fails.
RUN python -m pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
 && python -m pip --python /opt/bucketq/bin/python install --no-index --find-links /dist 'bucketq[operator,sidecar]' \
 && python -m pip --python /opt/bucketq/bin/python check \
 && /opt/bucketq/bin/bucketq --help >/dev/null \
 && /opt/bucketq/bin/python -c 'import bucketq.operator, bucketq.sidecar'

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="bucketq" \
      org.opencontainers.image.description="A Kubernetes-native message queue whose only durable store is an S3-compatible bucket" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/bucketq/bucketq"
COPY --from=build /opt/bucketq /opt/bucketq
ENV PATH=/opt/bucketq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# 65532 is the uid the operator gives injected sidecars (runAsNonRoot needs a numeric USER).
USER 65532:65532
WORKDIR /tmp
# operator: metrics 9090, probes 8080, webhook 9443; sidecar: API 3580, metrics 9580 (not Dapr's 3500/9090)
EXPOSE 3580 8080 9090 9443 9580
ENTRYPOINT ["bucketq"]
CMD ["--help"]
