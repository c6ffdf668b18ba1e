#!/usr/bin/env bash
# The README's test command: makes sure the system programs the tests start are installed, then
# runs every test of the workspace. As root it installs what is missing with apt-get; otherwise
# it names the Debian packages to install and stops. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()

# The Postgres tests start their own throwaway server from the server binaries (lease-testdb),
# unless DATABASE_URL names a server to use instead.
if [ -z "${DATABASE_URL:-}" ] && [ -z "${LEASE_PG_BINDIR:-}" ] \
    && ! command -v initdb >/dev/null 2>&1 \
    && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    missing+=(postgresql)
fi
# Process tests signal workers and frozen server processes with kill(1).
command -v kill >/dev/null 2>&1 || missing+=(procps)
# The connection-pooler tests start PgBouncer in front of the test server.
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
# The clock-step tests run a server under libfaketime.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
# The etcd tests start their own etcd clusters from the system's etcd (lease-testetcd), unless
# LEASE_ETCD_BIN names one.
if [ -z "${LEASE_ETCD_BIN:-}" ] && ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
    missing+=(etcd-server)
fi
# `leasectl run`'s tests supervise children written in Python (and the --events example is one).
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# Building the etcd client (etcd-client's build script) generates its gRPC code with protoc,
# unless PROTOC names one.
if [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null 2>&1; then
    missing+=(protobuf-compiler)
fi

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing the packages the tests need: ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        echo "the tests need these Debian packages: ${missing[*]}" >&2
        echo "install them (apt-get install -y ${missing[*]}) and run this again, or run it as root" >&2
        exit 1
    fi
fi

# leasectl without the etcd feature (the README's `cargo run --bin leasectl -- demo` build):
# an etcd URL names the feature to rebuild with.
cargo test -p leasectl --test cli_etcd_url "$@"
# Everything, with leasectl's etcd feature on (its etcd tests run the binary on etcd).
exec cargo test --workspace --features leasectl/etcd "$@"
