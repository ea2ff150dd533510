#!/bin/sh
# Starts gearmand on loopback (persistent queue, bounded retries) and stunnel in front of it
# (TLS on 4731, the only port the image exposes; docs/tls.md). Exits when either one dies,
# stopping the other, so that the container's restart policy brings back both: a gearmand
# behind a dead stunnel, or an stunnel in front of nothing, would look alive and serve no one.
set -eu
# The queue in WAL mode first: gearmand's sqlite writes block its one thread (gearfarm/hosts/gearmand.py).
sqlite3 /var/lib/gearmand/queue.db 'PRAGMA journal_mode=WAL;' >/dev/null
# Not daemonized (-d): a daemonized gearmand 1.1.20 sends its log to /dev/null (measured),
# while in the foreground --log-file stderr reaches `docker logs`.
gearmand -L 127.0.0.1 -p 4730 -q libsqlite3 --libsqlite3-db=/var/lib/gearmand/queue.db \
  --job-retries 3 --worker-wakeup 1 --log-file stderr --verbose WARNING &
gearmand_pid=$!
stunnel /etc/stunnel/gearmand.conf &
stunnel_pid=$!

stop_both() { kill -TERM "$gearmand_pid" "$stunnel_pid" 2>/dev/null || true; }
# docker stop signals PID 1 (this shell) only: pass it on, and exit once both are gone.
trap 'stop_both; wait; exit 0' TERM INT

# POSIX sh has no `wait -n`; poll both children (a background sleep keeps traps prompt).
while kill -0 "$gearmand_pid" 2>/dev/null && kill -0 "$stunnel_pid" 2>/dev/null; do
  sleep 1 &
  wait $! || true
done
echo "gearmand-entrypoint: gearmand or stunnel exited; stopping the other" >&2
stop_both
wait
exit 1
