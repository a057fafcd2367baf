# The lab server: `crashdrill serve` on 0.0.0.0:8000, CPU torch, data in the /data volume.
#
#   docker build -f docker/server.Dockerfile -t crashdrill-server .          # from the repo root
#   docker run --rm -p 127.0.0.1:8000:8000 -v crashdrill-data:/data crashdrill-server
#
# Then the lab is at http://127.0.0.1:8000 (publishing the port is yours to choose). The
# database is SQLite in /data/lab unless CRASHDRILL_DATABASE_URL names a Postgres; the
# checkpoint mirror is /data/lab-mirror unless CRASHDRILL_MIRROR says otherwise; every
# CRASHDRILL_* variable of docs/server.md works. Secrets (instructor token, database
# password, bucket key) come from the environment or a mounted file at run time: the image
# holds none. docs/docker.md has the rest (compose, SIGTERM, sizes, building offline).
#
# Build arguments:
#   BASE        the Python image (default the official python:3.11-slim-bookworm; any
#               Debian bookworm with python3 and python3-venv works, docker/test.sh uses
#               one made by debootstrap)
#   NODE_IMAGE  the image that fetches the page's npm packages (uPlot, supabase-js); Node
#               is not in the final image
#   TORCH, TORCH_INDEX  the torch requirement and the index of its CPU build
#   EXTRAS      the crashdrill extras (default server,postgres,gcs; docker/compose.yaml adds
#               ray for `crashdrill serve --ray`)
# Every package but torch is installed at the version the tests passed with: the lock,
# requirements/test.txt (compiled from every extra, so it pins whatever EXTRAS names), is
# the install's constraints, and torch's own dependencies come from it too. Ray among them:
# the server and every node of the cluster must run the same Ray and the same Python
# (docker/worker.Dockerfile). `python3 quickstart.py lock` refreshes the lock.
# Build-only inputs, never in the final image: docker/local/ca.crt (a CA bundle that pip
# and npm trust during the build) and docker/local/wheels/*.whl (e.g. a CPU torch wheel
# for a machine that cannot reach TORCH_INDEX); see docker/local/README.md.

ARG BASE=python:3.11-slim-bookworm
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG NODE_IMAGE=node:22-bookworm-slim

# ---- the page's npm packages ---------------------------------------------------------
FROM ${NODE_IMAGE} AS web
WORKDIR /src
COPY package.json package-lock.json ./
COPY docker/local/ /build-local/
RUN if [ -f /build-local/ca.crt ]; then export NODE_EXTRA_CA_CERTS=/build-local/ca.crt; fi \
    && npm ci --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error

# ---- the virtual environment: CPU torch, crashdrill and its server extras ------------
FROM ${BASE} AS build
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/crashdrill
COPY docker/local/ /build-local/
# torch first, on its own layer: it is most of the image and changes least. These lines
# are the same in server.Dockerfile and worker.Dockerfile, so that two builds with the
# same BASE and torch share the layer. A CPU wheel in docker/local/wheels/ stands in for
# the CPU index (its dependencies from PyPI). torch's C++ headers, tests and test
# binaries go: the lab compiles nothing (no torch.compile, no C++ extensions).
RUN set -e; \
    if [ -f /build-local/ca.crt ]; then \
        export PIP_CERT=/build-local/ca.crt SSL_CERT_FILE=/build-local/ca.crt \
               REQUESTS_CA_BUNDLE=/build-local/ca.crt; \
    fi; \
    pip=/opt/crashdrill/bin/pip; wheel=""; \
    case "$TORCH_INDEX" in */whl/cpu|*/whl/cpu/) \
        wheel=$(ls /build-local/wheels/torch-*+cpu-*.whl 2>/dev/null | head -1);; \
    esac; \
    if [ -n "$wheel" ]; then \
        $pip install --no-index --no-deps --find-links /build-local/wheels "$TORCH"; \
        $pip install "$TORCH"; \
    else \
        $pip install --index-url "$TORCH_INDEX" "$TORCH"; \
    fi; \
    t=$(/opt/crashdrill/bin/python -c "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])"); \
    rm -rf "$t/include" "$t/test" "$t/bin/protoc" "$t/bin/protoc-"* "$t/bin/"*Test
ARG EXTRAS=server,postgres,gcs
WORKDIR /src
COPY pyproject.toml README.md package.json ./
COPY requirements/test.txt requirements/torch.in requirements/
COPY scripts/build_web.py scripts/
COPY --from=web /src/node_modules node_modules
COPY crashdrill crashdrill
COPY trainer trainer
COPY workers workers
COPY server server
COPY drill drill
COPY web web
RUN set -e; \
    if [ -f /build-local/ca.crt ]; then \
        export PIP_CERT=/build-local/ca.crt SSL_CERT_FILE=/build-local/ca.crt \
               REQUESTS_CA_BUNDLE=/build-local/ca.crt; \
    fi; \
    /opt/crashdrill/bin/python scripts/build_web.py --no-install; \
    /opt/crashdrill/bin/pip install -c requirements/test.txt -r requirements/torch.in ".[${EXTRAS}]"; \
    cd / && /opt/crashdrill/bin/python -c "import crashdrill.server.app, torch; print('torch', torch.__version__)"

# ---- the image ------------------------------------------------------------------------
FROM ${BASE}
# tini as PID 1: it hands SIGTERM to the server and reaps what the trainers leave behind.
# After a clean shutdown uvicorn re-raises the SIGTERM: the server then ends by the signal
# (143), or with `--ray` by sys.exit(15) (Ray's handler in a driver); both are exit 0.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/crashdrill crashdrill \
    && mkdir -p /data /mirror && chown crashdrill:crashdrill /data /mirror
COPY --from=build /opt/crashdrill /opt/crashdrill
COPY docker/healthcheck.py /opt/crashdrill/bin/crashdrill-healthcheck
ENV PATH=/opt/crashdrill/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CRASHDRILL_DATA_DIR=/data/lab
USER crashdrill
WORKDIR /home/crashdrill
VOLUME ["/data"]
EXPOSE 8000
# Ready = the lab started and its database answers (GET /api/health). A first start
# migrates the database and resumes the runs of before: give it a minute.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "/opt/crashdrill/bin/crashdrill-healthcheck"]
# SIGTERM (docker stop): the server stops taking requests and detaches from its runs,
# as `crashdrill serve` does; the container's end kills those trainers, and the next
# start resumes each from its last checkpoint (--stop-runs-on-exit: stop them instead).
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "-e", "143", "-e", "15", "--", "crashdrill", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
