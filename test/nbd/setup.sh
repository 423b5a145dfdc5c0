#!/usr/bin/env bash
# Installs, idempotently, the NBD peers the host interop tests of
# internal/nbdsrv drive (none of them written by us): libnbd-bin (nbdinfo,
# nbdcopy), qemu-utils (qemu-img, qemu-io, qemu-nbd) and nbdkit.
# The tests fail, not skip, when a peer is missing (CI runs this first).
# --bench adds fio (its nbd engine) for the benchmark against qemu-nbd.
set -euo pipefail

PKGS=(libnbd-bin qemu-utils nbdkit)
if [ "${1:-}" = --bench ]; then
	PKGS+=(fio)
fi

log() { echo "nbd-setup: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root (apt-get)"
	exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing+=("$p")
	fi
done
if [ "${#missing[@]}" -gt 0 ]; then
	# Serialize with the VM setup: both use apt.
	mkdir -p "${CTLD_VM_CACHE:-/var/cache/ctld-vm}"
	exec 9>"${CTLD_VM_CACHE:-/var/cache/ctld-vm}/.lock"
	flock 9
	log "apt-get update"
	apt-get update -qq >&2
	log "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
