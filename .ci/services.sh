#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432), Redis (127.0.0.1:6379) and RabbitMQ (127.0.0.1:5672)
# answer; start local servers when they are installed and not running. Exit non-zero if a
# service stays down.
set -u
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_up() { for _ in $(seq 1 60); do up "$1" && return 0; sleep 0.5; done; return 1; }
status=0

if ! up 6379; then
  if command -v redis-server >/dev/null; then
    echo "services: starting redis-server"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir "${TMPDIR:-/tmp}" >/dev/null 2>&1 || true
  fi
  wait_up 6379 || { echo "services: Redis is not reachable on 127.0.0.1:6379"; status=1; }
fi

if ! up 5432; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  fi
  wait_up 5432 || { echo "services: PostgreSQL is not reachable on 127.0.0.1:5432"; status=1; }
fi

if ! up 5672; then
  if command -v rabbitmq-server >/dev/null; then
    echo "services: starting RabbitMQ"
    rabbitmq-server -detached >/dev/null 2>&1 || true
  fi
  wait_up 5672 || { echo "services: RabbitMQ is not reachable on 127.0.0.1:5672"; status=1; }
fi

[ $status -eq 0 ] && echo "services: PostgreSQL, Redis and RabbitMQ are up"
exit $status
