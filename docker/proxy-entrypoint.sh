#!/bin/sh
# The proxy image's entrypoint: docker/proxy-nginx.conf with the CRASHDRILL_PROXY_*
# variables filled in, checked (`nginx -t`), then nginx in the foreground.
# docs/docker.md#the-proxy says what each variable does. A bad value stops it with exit 2
# and a line naming the variable, its value and what is allowed.
set -eu

TEMPLATE=/etc/crashdrill-proxy/nginx.conf.in
RUN=/run/crashdrill-proxy
TLS_DIR=/etc/crashdrill-proxy/tls

bad() { echo "crashdrill-proxy: $1" >&2; exit 2; }

# number NAME DEFAULT MIN MAX: the variable's value, a whole number in MIN..MAX
number() {
    eval "value=\${$1:-$2}"
    case "$value" in
        '' | *[!0-9]*) bad "$1 = '$value': a whole number in $3..$4" ;;
    esac
    [ "$value" -ge "$3" ] && [ "$value" -le "$4" ] || bad "$1 = '$value': a whole number in $3..$4"
    echo "$value"
}

LISTEN=${CRASHDRILL_PROXY_LISTEN:-8080}
echo "$LISTEN" | grep -Eqx '(([0-9]{1,3}\.){3}[0-9]{1,3}:|\[[0-9A-Fa-f:]+\]:)?[0-9]{1,5}' \
    || bad "CRASHDRILL_PROXY_LISTEN = '$LISTEN': a port, or ADDRESS:PORT (127.0.0.1:8000, [::]:443)"
UPSTREAM=${CRASHDRILL_PROXY_UPSTREAM:-server:8000}
echo "$UPSTREAM" | grep -Eqx '[A-Za-z0-9.-]+:[0-9]{1,5}' \
    || bad "CRASHDRILL_PROXY_UPSTREAM = '$UPSTREAM': the lab as HOST:PORT (server:8000)"
CONNECTIONS_PER_ADDRESS=$(number CRASHDRILL_PROXY_CONNECTIONS_PER_ADDRESS 256 1 100000)
REQUESTS_PER_S=$(number CRASHDRILL_PROXY_REQUESTS_PER_S 100 1 100000)
REQUEST_BURST=$(number CRASHDRILL_PROXY_REQUEST_BURST 1000 0 100000)
HEADER_TIMEOUT_S=$(number CRASHDRILL_PROXY_HEADER_TIMEOUT_S 10 1 600)
KEEP_ALIVE_S=$(number CRASHDRILL_PROXY_KEEP_ALIVE_S 15 0 600)
WORKER_CONNECTIONS=$(number CRASHDRILL_PROXY_WORKER_CONNECTIONS 8192 64 1000000)
OPEN_FILES=$((WORKER_CONNECTIONS * 2 + 64))

# The source address of the proxy's connections to the lab: the one the lab trusts
# (CRASHDRILL_TRUSTED_PROXIES). Needed where the proxy and other clients share an address,
# as on the host's network (docker/compose.hostnet.yaml: 127.0.0.2).
BIND_LINE=""
if [ -n "${CRASHDRILL_PROXY_SOURCE:-}" ]; then
    echo "$CRASHDRILL_PROXY_SOURCE" | grep -Eqx '([0-9]{1,3}\.){3}[0-9]{1,3}|[0-9A-Fa-f:]+' \
        || bad "CRASHDRILL_PROXY_SOURCE = '$CRASHDRILL_PROXY_SOURCE': an IP address of this machine (127.0.0.2)"
    BIND_LINE="        proxy_bind $CRASHDRILL_PROXY_SOURCE;"
fi

TLS_LISTEN=""
TLS_LINES=""
case "${CRASHDRILL_PROXY_TLS:-0}" in
    0 | off | no | false) ;;
    1 | on | yes | true)
        for f in cert.pem key.pem; do
            [ -r "$TLS_DIR/$f" ] || bad "CRASHDRILL_PROXY_TLS is on but $TLS_DIR/$f is missing or unreadable (uid $(id -u)): put them in docker/tls/ or point CRASHDRILL_PROXY_TLS_DIR at their folder (docs/docker.md#tls)"
        done
        TLS_LISTEN=" ssl"
        TLS_LINES="        ssl_certificate $TLS_DIR/cert.pem;
        ssl_certificate_key $TLS_DIR/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:tls:10m;
        add_header Strict-Transport-Security \"max-age=31536000\" always;"
        ;;
    *) bad "CRASHDRILL_PROXY_TLS = '${CRASHDRILL_PROXY_TLS}': 1 (https with $TLS_DIR/cert.pem and key.pem) or 0" ;;
esac

mkdir -p "$RUN"
rm -f "$RUN/http.sock"
# Each placeholder inside a line, or (the optional lines) on a line of its own.
awk -v listen="$LISTEN" -v upstream="$UPSTREAM" -v per_address="$CONNECTIONS_PER_ADDRESS" \
    -v rate="$REQUESTS_PER_S" -v burst="$REQUEST_BURST" -v header="$HEADER_TIMEOUT_S" \
    -v keep="$KEEP_ALIVE_S" -v workers="$WORKER_CONNECTIONS" -v files="$OPEN_FILES" \
    -v bind="$BIND_LINE" -v tls_listen="$TLS_LISTEN" -v tls_lines="$TLS_LINES" '
    {
        gsub(/@LISTEN@/, listen); gsub(/@UPSTREAM@/, upstream)
        gsub(/@CONNECTIONS_PER_ADDRESS@/, per_address); gsub(/@REQUESTS_PER_S@/, rate)
        gsub(/@REQUEST_BURST@/, burst); gsub(/@HEADER_TIMEOUT_S@/, header)
        gsub(/@KEEP_ALIVE_S@/, keep); gsub(/@WORKER_CONNECTIONS@/, workers)
        gsub(/@OPEN_FILES@/, files); gsub(/@TLS_LISTEN@/, tls_listen)
        if ($0 == "@BIND_LINE@") { if (bind != "") print bind; next }
        if ($0 == "@TLS_LINES@") { if (tls_lines != "") print tls_lines; next }
        print
    }' "$TEMPLATE" >"$RUN/nginx.conf"

nginx -e stderr -q -t -c "$RUN/nginx.conf" || bad "nginx refuses the configuration above ($RUN/nginx.conf)"
scheme=http
[ -n "$TLS_LISTEN" ] && scheme=https
echo "crashdrill-proxy: $scheme on $LISTEN -> the lab at $UPSTREAM; $CONNECTIONS_PER_ADDRESS connections and $REQUESTS_PER_S requests/s (burst $REQUEST_BURST) per address; headers and bodies within ${HEADER_TIMEOUT_S} s, idle keep-alive ${KEEP_ALIVE_S} s${BIND_LINE:+; to the lab from $CRASHDRILL_PROXY_SOURCE}"
exec nginx -e stderr -c "$RUN/nginx.conf" -g 'daemon off;'
