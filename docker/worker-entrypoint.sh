#!/bin/sh
# A Ray node in the foreground: the head with RAY_HEAD=1, else a worker joining RAY_ADDRESS.
# Arguments go to `ray start` as they are (--num-cpus 4, --num-gpus 1, --node-ip-address …).
#
#   RAY_HEAD=1 [RAY_PORT=6379] [RAY_CLIENT_PORT=10001]   the head: no CPUs of its own, so
#                                                         that no run is placed on it
#   RAY_ADDRESS=HEAD:6379                                 a worker
set -eu
if [ "${RAY_HEAD:-0}" = 1 ]; then
    exec ray start --head --block --port "${RAY_PORT:-6379}" \
        --ray-client-server-port "${RAY_CLIENT_PORT:-10001}" \
        --num-cpus 0 --num-gpus 0 --include-dashboard false --disable-usage-stats "$@"
fi
: "${RAY_ADDRESS:?set RAY_ADDRESS=HEAD:6379, the Ray head this node joins (or RAY_HEAD=1)}"
exec ray start --block --address "$RAY_ADDRESS" --disable-usage-stats "$@"
