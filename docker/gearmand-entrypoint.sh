#!/bin/sh
# Starts gearmand on loopback (persistent queue, bounded retries) and stunnel in front of it.
set -eu
gearmand -L 127.0.0.1 -p 4730 -q libsqlite3 --libsqlite3-db=/var/lib/gearmand/queue.db \
  --job-retries 3 --log-file stderr -d
exec stunnel /etc/stunnel/gearmand.conf
