#!/usr/bin/env bash
# Installs, idempotently, the S3 server the blockstore's S3 backend is
# tested against: versitygw (Apache-2.0), built from its Go module with
# `go install` into a cache outside the repository (a few minutes the first
# time, nothing after). Prints the binary's path on stdout; everything else
# goes to stderr. The tests (internal/blockstore/s3store) fail, not skip,
# when the binary is missing: CI runs this first (make test-unit).
# Cache: $CTLD_S3_CACHE (default /var/cache/ctld-s3).
set -euo pipefail

VERSION=v1.8.0
CACHE=${CTLD_S3_CACHE:-/var/cache/ctld-s3}
BIN="$CACHE/versitygw-$VERSION"

log() { echo "s3-setup: $*" >&2; }

if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$CACHE"
# One build at a time; the second waiter finds the binary.
exec 9>"$CACHE/.lock"
flock 9
if [ ! -x "$BIN" ]; then
	GO=${GO:-go}
	tmp=$(mktemp -d "$CACHE/.build-XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	log "building versitygw $VERSION (go install, a few minutes the first time)"
	# Outside any module, so the repository's go.mod does not take part.
	(cd "$tmp" && GOBIN="$tmp/bin" "$GO" install "github.com/versity/versitygw/cmd/versitygw@$VERSION") >&2
	# Rename: a crash never leaves a half binary at $BIN.
	mv "$tmp/bin/versitygw" "$BIN"
fi
echo "$BIN"
