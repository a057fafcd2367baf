# The reverse proxy in front of the lab: Debian's nginx with its stream module, as user
# www-data, listening on 8080 (docs/docker.md#the-proxy).
#
#   docker build -f docker/proxy.Dockerfile -t crashdrill-proxy .      # from the repo root
#   docker run --rm -p 8000:8080 -e CRASHDRILL_PROXY_UPSTREAM=LAB_HOST:8000 crashdrill-proxy
#
# Per client address: at most CRASHDRILL_PROXY_CONNECTIONS_PER_ADDRESS connections open
# (counted at accept, so silent and half-sent sockets count too) and
# CRASHDRILL_PROXY_REQUESTS_PER_S requests a second; headers and bodies must arrive within
# CRASHDRILL_PROXY_HEADER_TIMEOUT_S; the lab's event streams pass unbuffered; https with
# CRASHDRILL_PROXY_TLS=1 and a cert.pem and key.pem mounted at /etc/crashdrill-proxy/tls
# (the compose files mount docker/tls/, or CRASHDRILL_PROXY_TLS_DIR). The lab must trust
# this proxy's address and no other (CRASHDRILL_TRUSTED_PROXIES): docker/compose.yaml pins it.
#
# Build argument: BASE, any Debian bookworm (default debian:bookworm-slim; docker/test.sh
# uses its debootstrap image, which has no registry to pull from).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx libnginx-mod-stream \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
    && mkdir -p /run/crashdrill-proxy /etc/crashdrill-proxy/tls \
    && chown www-data:www-data /run/crashdrill-proxy
COPY docker/proxy-nginx.conf /etc/crashdrill-proxy/nginx.conf.in
COPY docker/proxy-entrypoint.sh /usr/local/bin/crashdrill-proxy
USER www-data
EXPOSE 8080
# SIGQUIT: nginx finishes the requests in flight, then exits (SIGTERM drops them).
STOPSIGNAL SIGQUIT
ENTRYPOINT ["sh", "/usr/local/bin/crashdrill-proxy"]
