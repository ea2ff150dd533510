#!/bin/sh
# Makes the cluster on first start (the database and the role "gearfarm", which the farm's
# hosts use), then runs PostgreSQL in the foreground with TLS from the mounted farm
# certificates. Nothing but the local socket and hostssl with a farm certificate is admitted:
# the certificate is the credential, as for gearmand's stunnel (docs/tls.md).
set -eu
tls=/etc/gearfarm/tls
for f in server.crt server.key ca.crt crl.pem; do
  [ -r "$tls/$f" ] || { echo "postgres-entrypoint: $tls/$f is missing or unreadable: mount the farm's certificates (docker/lab.py init)" >&2; exit 2; }
done
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  initdb -D "$PGDATA" -U postgres --auth-local=peer --auth-host=reject -E UTF8 >/dev/null
  postgres --single -D "$PGDATA" postgres >/dev/null <<'SQL'
CREATE ROLE gearfarm LOGIN;
CREATE DATABASE gearfarm OWNER gearfarm;
SQL
fi
# PostgreSQL wants its key private to its user; the mount is read-only and may be shared.
install -m 600 "$tls/server.key" /run/postgresql/server.key
cat > "$PGDATA/pg_hba.conf" <<'HBA'
local all postgres peer
hostssl gearfarm gearfarm all trust clientcert=verify-ca
HBA
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql \
  -c ssl=on -c ssl_cert_file="$tls/server.crt" -c ssl_key_file=/run/postgresql/server.key \
  -c ssl_ca_file="$tls/ca.crt" -c ssl_crl_file="$tls/crl.pem" -c ssl_min_protocol_version=TLSv1.2 \
  -c max_connections=200
