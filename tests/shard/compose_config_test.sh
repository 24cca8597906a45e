#!/bin/sh
# SPDX-License-Identifier: MIT
# Checks deploy/docker-compose.yml and deploy/docker-compose.tls.yml with `docker-compose config -q` (no Docker
# engine needed). Exits 77 (ctest SKIP_RETURN_CODE) when docker-compose is not
# installed. Usage: compose_config_test.sh SOURCE_DIR
set -eu
src="${1:-${KV_SOURCE_DIR:-.}}"
file="$src/deploy/docker-compose.yml"
if ! command -v docker-compose >/dev/null 2>&1; then
    echo "SKIP: docker-compose is not installed; $file not checked"
    exit 77
fi
[ -f "$src/deploy/Dockerfile" ] || { echo "missing $src/deploy/Dockerfile" >&2; exit 1; }
docker-compose -f "$file" config -q
# The resolved file must keep the services and the published router port.
out="$(docker-compose -f "$file" config)"
for want in "node1:" "node2:" "node3:" "router:" "init:" "127.0.0.1:7000:7000" \
    "kvctl cluster init --rf 3" "healthcheck:" "tcp://127.0.0.1:7001" "tcp://127.0.0.1:7000" \
    "--http-listen" "http://0.0.0.0:9100" "127.0.0.1:9000:9000"; do
    case "$out" in
    *"$want"*) ;;
    *) echo "docker-compose config lacks '$want'" >&2; exit 1 ;;
    esac
done
case "$(cat "$file")" in
*"
version:"*) echo "$file still has the obsolete version: key" >&2; exit 1 ;;
esac
# the monitoring profile (Prometheus, Grafana) resolves too
docker-compose -f "$file" --profile monitoring config -q
echo "ok: $file"
# The TLS variant: every address tls+tcp://, certificates and the admin token.
tls="$src/deploy/docker-compose.tls.yml"
docker-compose -f "$tls" config -q
out="$(docker-compose -f "$tls" config)"
for want in "tls+tcp://0.0.0.0:7001" "tls+tcp://node1:7001" "tls+tcp://127.0.0.1:7000" \
    "/tls/ca.crt" "/tls/router.key" "--admin-auth-file" "127.0.0.1:7000:7000"; do
    case "$out" in
    *"$want"*) ;;
    *) echo "docker-compose config of $tls lacks '$want'" >&2; exit 1 ;;
    esac
done
case "$out" in
*'"tcp://'*|*" tcp://"*) echo "$tls has a plaintext tcp:// address" >&2; exit 1 ;;
esac
echo "ok: $tls"
