#!/bin/sh
# SPDX-License-Identifier: MIT
# Makes a private CA and one certificate per process of the compose cluster
# (node1..3, router, kvctl) in DIR (default deploy/tls), and an admin token,
# for deploy/docker-compose.tls.yml. Keys are readable by the image's user
# (uid 10001) only when DIR is chowned to it: run
#   sudo chown -R 10001:10001 deploy/tls
# after this script (or run it as that user). ca.key signs new certificates:
# keep it elsewhere once they exist.
set -eu
dir="${1:-$(dirname "$0")/tls}"
mkdir -p "$dir"
cd "$dir"
umask 077
[ -f ca.crt ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout ca.key -out ca.crt -days 3650 -subj "/CN=hotkv compose CA" 2>/dev/null
for n in node1 node2 node3 router kvctl; do
    [ -f "$n.crt" ] && continue
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$n.key" -out "$n.csr" -subj "/CN=$n" 2>/dev/null
    printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' \
        "$n" > "$n.ext"
    openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
        -extfile "$n.ext" -out "$n.crt" 2>/dev/null
    rm -f "$n.csr" "$n.ext"
done
[ -f admin.token ] || od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > admin.token
chmod 644 ./*.crt
echo "certificates and admin.token in $PWD"
