# PostgreSQL from Debian's packages, on a base imported from debootstrap (the tests' stand-in
# for the official image: same environment variables, same data directory, same port).
ARG BASE_IMAGE=jobs-engine-postgres-base:trixie
FROM ${BASE_IMAGE}
COPY postgres-entrypoint.sh /usr/local/bin/
ENV PGDATA=/var/lib/postgresql/data
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
