#!/usr/bin/env bash
# Installs, idempotently, what the fleet's protocol model (test/model) is
# checked with: Debian's spin (the Promela model checker) and gcc (spin
# writes the verifier as C). The model's test fails, not skips, when they
# are missing: CI runs this first (make test-unit).
set -euo pipefail

PKGS=(spin gcc)

log() { echo "model-setup: $*" >&2; }

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing+=("$p")
	fi
done
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		log "${missing[*]} missing and installing needs root (apt-get)"
		exit 1
	fi
	# Serialize with the other setup scripts: all use apt.
	mkdir -p "${CTLD_VM_CACHE:-/var/cache/ctld-vm}"
	exec 9>"${CTLD_VM_CACHE:-/var/cache/ctld-vm}/.lock"
	flock 9
	log "apt-get update"
	apt-get update -qq >&2
	log "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
command -v spin
