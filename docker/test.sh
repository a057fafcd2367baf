#!/usr/bin/env bash
# Build the images, bring the compose stack up on this machine, and crash-test it.
#
#   sudo docker/test.sh            # exit 0 only when every step held; "skipped: why" + 0
#                                  # when Docker cannot be set up here
#
# Steps (a failure prints "FAILED step '<step>': why" and exits 1):
#   1. Docker: the CLI (apt-get install docker.io docker-compose debootstrap when missing and
#      root), a daemon (one started here with host networking only, when none runs);
#   2. base images: the official python/node/postgres images when a registry answers, else
#      local ones with the same Python (debootstrap of Debian bookworm, Debian's nodejs and
#      postgresql), kept as crashdrill-local/* for the next run (CRASHDRILL_DOCKER_CLEAN=1:
#      removed at the end too);
#   3. builds docker/server.Dockerfile (with the ray extra) and docker/worker.Dockerfile
#      (CPU torch here; the CUDA build is for machines with a registry and a GPU), unless
#      CRASHDRILL_TEST_SERVER_IMAGE and CRASHDRILL_TEST_WORKER_IMAGE name images to test
#      (kept then), and docker/proxy.Dockerfile (nginx; CRASHDRILL_TEST_PROXY_IMAGE: kept);
#   4. docker/compose.yaml + docker/compose.hostnet.yaml up on free loopback ports: Postgres,
#      a Ray head, two CPU workers, the lab (SIGTERM-clean, healthy) and nginx in front;
#   5. through the proxy (docker/lab_check.py): a quick pair with a student's setting (a
#      frozen preset each worker trains its own copy of), run A crash-tested, its resume
#      check bit-identical; then a longer pair whose run A loses its worker container
#      (docker kill) and resumes on the other worker from the mirror, bit-identically;
#   6. the proxy (docker/proxy_check.py): the idle/half-sent socket flood of
#      benchmarks/socket_flood.py against it while /api/health is polled and a crash test
#      runs (sockets held, health p99, bit-identical); per-address pair quotas see each
#      client's own address through it and nobody's X-Forwarded-For, through it or
#      straight to the lab; the event stream's first frame; https with a self-signed
#      certificate made here (skipped without openssl);
#   7. tears down what it made: the stack, its volumes, the images it built, the daemon it
#      started, the build inputs it put in docker/local/, the certificate.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
T0=$(date +%s)
ID="$(date +%s)-$$"
WORK="$(mktemp -d /tmp/crashdrill-docker-test.XXXXXX)"
STEP="start"
DOCKERD_PID=""
DANGLING_BEFORE=""
COMPOSE=()
PROJECT="crashdrilltest$$"
BUILT_IMAGES=()
LOCAL_FILES=()
STACK_UP=0
TLS_DIR=""

step() { STEP="$1"; echo "== $1 ($(($(date +%s) - T0)) s)"; }
fail() { echo "FAILED step '$STEP': $*" >&2; exit 1; }
skip() { echo "skipped: $*"; exit 0; }

teardown() {
    local rc=$?
    trap - EXIT
    set +e
    if [ "$STACK_UP" = 1 ]; then
        if [ "$rc" != 0 ]; then
            echo "-- the stack's last log lines (failed step: $STEP)"
            "${COMPOSE[@]}" logs --no-color --tail 40 2>&1 | tail -150
        fi
        "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1
    fi
    for image in "${BUILT_IMAGES[@]}"; do docker rmi -f "$image" >/dev/null 2>&1; done
    if [ -n "$DANGLING_BEFORE" ]; then  # the build stages' images (untagged, no children)
        docker images -q -f dangling=true | grep -vxF -f "$DANGLING_BEFORE" \
            | xargs -r docker rmi >/dev/null 2>&1
    fi
    if [ "${CRASHDRILL_DOCKER_CLEAN:-0}" = 1 ]; then
        docker images -q 'crashdrill-local/*' | xargs -r docker rmi -f >/dev/null 2>&1
    fi
    for f in "${LOCAL_FILES[@]}"; do rm -rf "$f"; done
    [ -n "$TLS_DIR" ] && rm -rf "$TLS_DIR"
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 1 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
    fi
    rm -rf "$WORK"
    echo "docker/test.sh: exit $rc after $(($(date +%s) - T0)) s"
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---- 1. Docker ------------------------------------------------------------------------
step "Docker installed"
if ! command -v docker >/dev/null || ! { docker compose version >/dev/null 2>&1 \
        || command -v docker-compose >/dev/null; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose \
            debootstrap >"$WORK/apt.log" 2>&1 \
            || skip "apt-get could not install docker.io docker-compose ($(tail -1 "$WORK/apt.log"))"
    else
        skip "no docker CLI with compose, and no way to install it here (needs root and apt-get)"
    fi
fi
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); else COMPOSE=(docker-compose); fi

step "Docker daemon"
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || skip "no Docker daemon answers and starting one needs root"
    command -v dockerd >/dev/null || skip "no Docker daemon answers and dockerd is not installed"
    dockerd --bridge=none --iptables=false --ip-masq=false >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 \
        || skip "dockerd does not start here: $(tail -2 "$WORK/dockerd.log" | tr '\n' ' ')"
fi
echo "   $(docker version --format 'Docker {{.Server.Version}}'), $("${COMPOSE[@]}" version --short 2>/dev/null || echo compose)"

# ---- 2. base images ---------------------------------------------------------------------
step "base images"
PYTHON_IMAGE=python:3.11-slim-bookworm
NODE_IMAGE=node:22-bookworm-slim
POSTGRES_IMAGE=postgres:16-bookworm
if ! timeout 120 docker pull -q "$PYTHON_IMAGE" >/dev/null 2>&1; then
    echo "   no image registry answers: local base images from the Debian archive"
    PYTHON_IMAGE=crashdrill-local/python:3.11-bookworm
    NODE_IMAGE=crashdrill-local/node:bookworm
    POSTGRES_IMAGE=crashdrill-local/postgres:15
    if ! docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null || skip "no registry and no debootstrap to make a base image"
        mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | grep -v security | head -1)
        mirror=${mirror:-http://deb.debian.org/debian}
        echo "   debootstrap bookworm from $mirror"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
            || fail "debootstrap: $(tail -2 "$WORK/debootstrap.log" | tr '\n' ' ')"
        rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/* \
            "$WORK"/rootfs/usr/share/doc/* "$WORK"/rootfs/usr/share/man/*
        tar -C "$WORK/rootfs" -c . | docker import -c 'CMD ["python3"]' - "$PYTHON_IMAGE" \
            >/dev/null || fail "docker import of the debootstrap root"
        rm -rf "$WORK/rootfs"
    fi
    if ! docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
        printf 'FROM %s\nRUN apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*\n' \
            "$PYTHON_IMAGE" | docker build -q --network host -t "$NODE_IMAGE" - >"$WORK/node.log" 2>&1 \
            || fail "local node image: $(tail -3 "$WORK/node.log" | tr '\n' ' ')"
    fi
    if ! docker image inspect "$POSTGRES_IMAGE" >/dev/null 2>&1; then
        docker build -q --network host -f docker/postgres-debian.Dockerfile \
            --build-arg BASE="$PYTHON_IMAGE" -t "$POSTGRES_IMAGE" . >"$WORK/pg.log" 2>&1 \
            || fail "local postgres image: $(tail -3 "$WORK/pg.log" | tr '\n' ' ')"
    fi
else
    for image in "$NODE_IMAGE" "$POSTGRES_IMAGE"; do
        timeout 300 docker pull -q "$image" >/dev/null || fail "docker pull $image"
    done
fi
echo "   python: $PYTHON_IMAGE ($(docker run --rm --network host "$PYTHON_IMAGE" python3 -V 2>&1)), node: $NODE_IMAGE, postgres: $POSTGRES_IMAGE"

# Build-only inputs (docker/local/README.md): this machine's CA bundle, and a CPU torch
# wheel when pip here has one (no download.pytorch.org needed then).
[ -d docker/local/wheels ] || { mkdir -p docker/local/wheels && LOCAL_FILES+=(docker/local/wheels); }
if [ -f /etc/ssl/certs/ca-certificates.crt ] && [ ! -e docker/local/ca.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt docker/local/ca.crt && LOCAL_FILES+=(docker/local/ca.crt)
fi
for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
    for whl in "$dir"/torch-*+cpu-cp311-*x86_64.whl; do
        [ -f "$whl" ] || continue
        target="docker/local/wheels/$(basename "$whl")"
        [ -e "$target" ] || { cp "$whl" "$target" && LOCAL_FILES+=("$target"); }
        break 2
    done
done

# ---- 3. builds --------------------------------------------------------------------------
DANGLING_BEFORE="$WORK/dangling-before"
docker images -q -f dangling=true >"$DANGLING_BEFORE"
echo "not-an-image-id" >>"$DANGLING_BEFORE"  # grep -f with an empty file would match nothing
SERVER_IMAGE="${CRASHDRILL_TEST_SERVER_IMAGE:-}"
WORKER_IMAGE="${CRASHDRILL_TEST_WORKER_IMAGE:-}"
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}'; }
if [ -n "$SERVER_IMAGE" ] && [ -n "$WORKER_IMAGE" ]; then
    step "images given: $SERVER_IMAGE ($(size "$SERVER_IMAGE")), $WORKER_IMAGE ($(size "$WORKER_IMAGE"))"
else
    SERVER_IMAGE="crashdrill-test-server:$ID"
    WORKER_IMAGE="crashdrill-test-worker:$ID"
    step "build the server image (docker/server.Dockerfile)"
    t=$(date +%s)
    BUILT_IMAGES+=("$SERVER_IMAGE")
    docker build --network host -f docker/server.Dockerfile --build-arg BASE="$PYTHON_IMAGE" \
        --build-arg NODE_IMAGE="$NODE_IMAGE" --build-arg EXTRAS=server,postgres,gcs,ray \
        --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu \
        -t "$SERVER_IMAGE" . >"$WORK/server-build.log" 2>&1 \
        || fail "$(tail -15 "$WORK/server-build.log")"
    echo "   built in $(($(date +%s) - t)) s: $(size "$SERVER_IMAGE")"

    step "build the worker image (docker/worker.Dockerfile, CPU torch: the server's torch layer)"
    t=$(date +%s)
    BUILT_IMAGES+=("$WORKER_IMAGE")
    docker build --network host -f docker/worker.Dockerfile --build-arg BASE="$PYTHON_IMAGE" \
        --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu \
        -t "$WORKER_IMAGE" . >"$WORK/worker-build.log" 2>&1 \
        || fail "$(tail -15 "$WORK/worker-build.log")"
    echo "   built in $(($(date +%s) - t)) s: $(size "$WORKER_IMAGE")"
fi
PROXY_IMAGE="${CRASHDRILL_TEST_PROXY_IMAGE:-}"
if [ -n "$PROXY_IMAGE" ]; then
    step "proxy image given: $PROXY_IMAGE ($(size "$PROXY_IMAGE"))"
else
    # On the Python base: Debian bookworm, the same as debian:bookworm-slim for nginx, and
    # already here (no registry needed).
    PROXY_IMAGE="crashdrill-test-proxy:$ID"
    step "build the proxy image (docker/proxy.Dockerfile: Debian's nginx)"
    t=$(date +%s)
    BUILT_IMAGES+=("$PROXY_IMAGE")
    docker build --network host -f docker/proxy.Dockerfile --build-arg BASE="$PYTHON_IMAGE" \
        -t "$PROXY_IMAGE" . >"$WORK/proxy-build.log" 2>&1 \
        || fail "$(tail -15 "$WORK/proxy-build.log")"
    echo "   built in $(($(date +%s) - t)) s: $(size "$PROXY_IMAGE")"
fi

# ---- 4. the stack -----------------------------------------------------------------------
step "compose up (Postgres, Ray head, two CPU workers, the lab, its proxy) on free loopback ports"
read -r PORT LAB_PORT DB_PORT RAY_PORT CLIENT_PORT AGENT_HEAD AGENT_1 AGENT_2 < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(8)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
export CRASHDRILL_PORT=$PORT CRASHDRILL_LAB_PORT=$LAB_PORT CRASHDRILL_DB_PORT=$DB_PORT
export CRASHDRILL_RAY_PORT=$RAY_PORT CRASHDRILL_PROXY_IMAGE=$PROXY_IMAGE
export CRASHDRILL_RAY_CLIENT_PORT=$CLIENT_PORT CRASHDRILL_RAY_AGENT_PORT_HEAD=$AGENT_HEAD
export CRASHDRILL_RAY_AGENT_PORT_1=$AGENT_1 CRASHDRILL_RAY_AGENT_PORT_2=$AGENT_2
export CRASHDRILL_SERVER_IMAGE=$SERVER_IMAGE CRASHDRILL_WORKER_IMAGE=$WORKER_IMAGE
export CRASHDRILL_POSTGRES_IMAGE=$POSTGRES_IMAGE CRASHDRILL_PYTHON_IMAGE=$PYTHON_IMAGE
# compose makes the stack's own network (compose.yaml pins its range for the proxy's
# address) though no service here uses it: a range of its own per run, so that two runs on
# one machine do not ask Docker for the same one.
net=$((RANDOM % 200 + 20))
export CRASHDRILL_SUBNET=172.30.$net.0/24 CRASHDRILL_SUBNET_DYNAMIC=172.30.$net.0/25
export CRASHDRILL_PROXY_ADDRESS=172.30.$net.200
# 2 CPUs a worker (the compose default) and no run limit of the lab's own: the cluster's
# nodes decide how many runs train (the Ray queue). The lost-worker check needs the
# surviving worker to have room for A beside B.
export CRASHDRILL_WORKER_CPUS=2 CRASHDRILL_MAX_CONCURRENT=
CRASHDRILL_POSTGRES_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
export CRASHDRILL_POSTGRES_PASSWORD
COMPOSE+=(-p "$PROJECT" -f docker/compose.yaml -f docker/compose.hostnet.yaml)
STACK_UP=1
"${COMPOSE[@]}" up -d --no-build db ray-head worker worker-2 lab lab-proxy >"$WORK/up.log" 2>&1 \
    || fail "$(tail -10 "$WORK/up.log")"
URL="http://127.0.0.1:$PORT"
LAB_URL="http://127.0.0.1:$LAB_PORT"
echo "   the lab at $URL through nginx, itself at $LAB_URL (Postgres :$DB_PORT, Ray :$RAY_PORT, client :$CLIENT_PORT)"

step "the lab is ready through the proxy and its container healthy"
python3 docker/lab_check.py --url "$URL" --ready-only --ready-timeout 240 || fail "see above"
"${COMPOSE[@]}" logs --no-color lab-proxy 2>&1 | grep -o 'crashdrill-proxy: .*' | head -1 | sed 's/^/   /'
server_container=$("${COMPOSE[@]}" ps -q lab)
for _ in $(seq 1 60); do
    health=$(docker inspect -f '{{.State.Health.Status}}' "$server_container")
    [ "$health" = healthy ] && break
    sleep 1
done
[ "$health" = healthy ] || fail "the server container's HEALTHCHECK says $health"
user=$(docker exec "$server_container" id -un)
[ "$user" = crashdrill ] || fail "the server runs as $user, not the non-root user crashdrill"
echo "   healthy, as user $user"

# ---- 5. through the API, through the proxy ------------------------------------------------
step "a quick pair; run A crash-tested; its resume check bit-identical"
python3 docker/lab_check.py --url "$URL" || fail "see above"

step "run A's worker container killed mid-run; A resumes on the other worker from the mirror"
python3 docker/lab_check.py --url "$URL" --kill-worker-of-a \
    "$("${COMPOSE[@]}" ps -q worker)" "$("${COMPOSE[@]}" ps -q worker-2)" || fail "see above"

# ---- 6. the proxy -------------------------------------------------------------------------
step "socket flood through the proxy: /api/health polled, a crash test bit-identical"
python3 docker/proxy_check.py flood --url "$URL" --sockets 2000 --addresses 4 --seconds 15 \
    || fail "see above"

step "per-address quotas see each client's own address through the proxy, and no one's X-Forwarded-For"
python3 docker/proxy_check.py forwarded --url "$URL" --lab-url "$LAB_URL" || fail "see above"

step "https through the proxy (a self-signed certificate made now)"
if command -v openssl >/dev/null; then
    TLS_DIR="$(mktemp -d /tmp/crashdrill-docker-tls.XXXXXX)"
    chmod 755 "$TLS_DIR"  # nginx reads it as www-data; a throwaway key
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
        -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" -keyout "$TLS_DIR/key.pem" \
        -out "$TLS_DIR/cert.pem" >"$WORK/openssl.log" 2>&1 || fail "$(tail -3 "$WORK/openssl.log")"
    chmod 644 "$TLS_DIR"/*.pem
    CRASHDRILL_PROXY_TLS=1 CRASHDRILL_PROXY_TLS_DIR="$TLS_DIR" "${COMPOSE[@]}" up -d --no-deps \
        --no-build lab-proxy >"$WORK/tls-up.log" 2>&1 || fail "$(tail -10 "$WORK/tls-up.log")"
    ok=0
    for _ in $(seq 1 30); do
        python3 docker/proxy_check.py tls --url "https://127.0.0.1:$PORT" --cafile "$TLS_DIR/cert.pem" \
            >"$WORK/tls.log" 2>&1 && { ok=1; break; }
        sleep 0.5
    done
    cat "$WORK/tls.log"
    [ "$ok" = 1 ] || fail "see above"
else
    echo "   skipped: no openssl to make a certificate"
fi

step "SIGTERM: docker stop ends the lab cleanly"
t=$(date +%s)
docker stop -t 30 "$server_container" >/dev/null || fail "docker stop"
code=$(docker inspect -f '{{.State.ExitCode}}' "$server_container")
[ "$code" = 0 ] || fail "the server exited $code after SIGTERM (expected 0)"
echo "   stopped in $(($(date +%s) - t)) s, exit 0"

step "teardown"
echo "PASSED: every step held in $(($(date +%s) - T0)) s"
