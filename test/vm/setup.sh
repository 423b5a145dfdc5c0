#!/usr/bin/env bash
# Prepares this machine for the ctld test VM, idempotently:
#  - installs the Debian packages the VM and the kernel tests need, if missing;
#  - fetches the stock Debian kernel (the package linux-image-amd64 depends on,
#    looked up now, not hard-coded), unpacks it into the cache and runs depmod.
# Prints the unpacked kernel's directory on stdout (everything else goes to stderr).
# Cache: $CTLD_VM_CACHE (default /var/cache/ctld-vm), outside the repository.
set -euo pipefail

CACHE=${CTLD_VM_CACHE:-/var/cache/ctld-vm}
# strace: internal/agent's TestExecSyscallBudget counts the agent's syscalls with it.
PKGS=(qemu-system-x86 busybox-static kmod cpio runsc nftables xfsprogs e2fsprogs iproute2 util-linux nbd-client strace)

log() { echo "setup: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root (apt-get, depmod, and the kernel tests need it)"
	exit 1
fi

mkdir -p "$CACHE"
# One setup at a time: several test runs may start together.
exec 9>"$CACHE/.lock"
flock 9

apt_updated=0
apt_update() {
	if [ "$apt_updated" = 0 ]; then
		log "apt-get update"
		apt-get update -qq >&2
		apt_updated=1
	fi
}

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing+=("$p")
	fi
done
if [ "${#missing[@]}" -gt 0 ]; then
	apt_update
	log "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

kernel_pkg() {
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
pkg=$(kernel_pkg || true)
if [ -z "$pkg" ]; then
	apt_update
	pkg=$(kernel_pkg || true)
fi
if [ -z "$pkg" ]; then
	log "cannot find the kernel package that linux-image-amd64 depends on"
	exit 1
fi

dir="$CACHE/$pkg"
if [ ! -e "$dir/.done" ]; then
	log "fetching $pkg"
	tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) || {
		apt_update
		(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
	}
	dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/root"
	ver=$(ls "$tmp/root/lib/modules")
	# The package ships no modules.dep: build it so modprobe works in the guest.
	depmod -b "$tmp/root" "$ver"
	rm -rf "$dir"
	mv "$tmp/root" "$dir"
	touch "$dir/.done"
	log "kernel $ver unpacked in $dir"
fi
echo "$dir"
