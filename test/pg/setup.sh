#!/usr/bin/env bash
# Installs, idempotently, the PostgreSQL server the manager's PostgreSQL
# backend is tested against: Debian's postgresql (initdb, postgres under
# /usr/lib/postgresql/<major>/bin). The tests (internal/pgtest) start their
# own server from these binaries in a temp dir, as the postgres account
# the package creates, and fail, not skip, when they are missing: CI runs
# this first (make test-unit). Installing here creates no system cluster.
# Prints the binaries' directory on stdout; everything else goes to stderr.
set -euo pipefail

log() { echo "pg-setup: $*" >&2; }

bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1; }

if [ -z "$(bindir)" ] || [ ! -x "$(bindir)/postgres" ] || ! getent passwd postgres >/dev/null; then
	if [ "$(id -u)" != 0 ]; then
		log "PostgreSQL is missing and installing it needs root (apt-get)"
		exit 1
	fi
	# Serialize with the other setup scripts: all use apt.
	mkdir -p "${CTLD_VM_CACHE:-/var/cache/ctld-vm}"
	exec 9>"${CTLD_VM_CACHE:-/var/cache/ctld-vm}/.lock"
	flock 9
	# The tests run their own servers: no cluster for the package to start.
	mkdir -p /etc/postgresql-common/createcluster.d
	echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/ctld-tests.conf
	log "apt-get update"
	apt-get update -qq >&2
	log "installing postgresql"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
fi
dir=$(bindir)
if [ ! -x "$dir/initdb" ] || [ ! -x "$dir/postgres" ]; then
	log "no initdb/postgres in $dir after the install"
	exit 1
fi
echo "$dir"
