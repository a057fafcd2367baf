# A Ray node for the lab's cluster executor (`crashdrill serve --ray`, docs/cluster.md):
# a worker that trains the runs placed on it, or the cluster's head (RAY_HEAD=1).
#
#   docker build -f docker/worker.Dockerfile -t crashdrill-worker .          # from the repo root
#   docker run --gpus all -e RAY_ADDRESS=HEAD:6379 crashdrill-worker --num-gpus 1
#   docker run -e RAY_HEAD=1 -p 6379:6379 -p 10001:10001 crashdrill-worker     # the head
#
# Arguments after the image name go to `ray start` (--num-cpus, --num-gpus, --resources…).
# The checkpoint mirror's credentials come at run time, never from the image: a shared
# directory mounted where the server's CRASHDRILL_MIRROR points, or for a bucket
# GOOGLE_APPLICATION_CREDENTIALS naming a mounted key file (docs/production.md).
#
# Build arguments:
#   BASE        the Python image; it must be the server image's BASE (default the official
#               python:3.11-slim-bookworm): Ray refuses a driver and nodes whose Python
#               differs, to the patch release. CUDA comes with torch: PyPI's torch wheel
#               carries the CUDA runtime, cuBLAS, cuDNN and NCCL as pip packages, so the
#               NVIDIA container runtime only has to mount the driver (--gpus).
#   TORCH, TORCH_INDEX  the torch requirement and its index (default PyPI: the CUDA build;
#               https://download.pytorch.org/whl/cpu for a CPU node)
#   EXTRAS      the crashdrill extras (default gpu,gcs,ray: NVML telemetry, GCS mirror, Ray)
# Every package but torch at the version the tests passed with, Ray the server's among
# them: requirements/test.txt is the install's constraints, as in docker/server.Dockerfile.
# Build-only inputs as for the server image: docker/local/ (docker/local/README.md).

ARG BASE=python:3.11-slim-bookworm
ARG TORCH_INDEX=https://pypi.org/simple

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
ARG EXTRAS=gpu,gcs,ray
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/test.txt requirements/torch.in requirements/
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
    /opt/crashdrill/bin/pip install -c requirements/test.txt -r requirements/torch.in ".[${EXTRAS}]"; \
    cd / && /opt/crashdrill/bin/python -c "import crashdrill.workers.ray_node, torch, ray; print('torch', torch.__version__, 'ray', ray.__version__)"

FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/crashdrill crashdrill \
    && mkdir -p /mirror /nodes && chown crashdrill:crashdrill /mirror /nodes
COPY --from=build /opt/crashdrill /opt/crashdrill
COPY docker/worker-entrypoint.sh /opt/crashdrill/bin/crashdrill-node
ENV PATH=/opt/crashdrill/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CRASHDRILL_NODE_DIR=/nodes \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER crashdrill
WORKDIR /home/crashdrill
# SIGTERM (docker stop) goes to `ray start --block` and its process group: the node leaves
# the cluster, and the lab resumes its runs on another node from the mirror.
ENTRYPOINT ["tini", "-g", "--", "sh", "/opt/crashdrill/bin/crashdrill-node"]
