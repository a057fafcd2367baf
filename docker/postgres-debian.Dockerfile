# Postgres from Debian's own package, with the official postgres image's interface
# (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB; data in /var/lib/postgresql/data;
# PGPORT; pg_isready). For machines that reach the Debian archive but no image registry,
# like the one docker/test.sh runs on; elsewhere compose.yaml takes the official image.
#
#   docker build -f docker/postgres-debian.Dockerfile --build-arg BASE=debian:bookworm-slim \
#       -t crashdrill-postgres:15 .                       # from the repo root
#   CRASHDRILL_POSTGRES_IMAGE=crashdrill-postgres:15 docker compose -f docker/compose.yaml up
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15 /etc/postgresql/15/main \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY docker/postgres-debian-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint"]
