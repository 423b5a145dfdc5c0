#!/usr/bin/env bash
# Prepares this machine for the ctld test VM, idempotently:
#  - installs the Debian packages the VM and the kernel tests need, if missing;
#  - fetches the stock Debian kernel (the package linux-image-amd64 depends on,
#    looked up now, not hard-coded), unpacks it into the cache and runs depmod;
#  - builds the pinned current gVisor runsc (RUNSC_VERSION, beside Debian's
#    runsc 20221219) with the Go toolchain into the cache, verified by the Go
#    module checksum database; the VM sees it through its read-only root.
# Prints the unpacked kernel's directory on stdout (everything else goes to stderr).
# `setup.sh --runsc-dir` only prints the current runsc's directory (fails if
# it is not built yet): `make RUNSC=current` puts it first on the guest's PATH.
# Cache: $CTLD_VM_CACHE (default /var/cache/ctld-vm), outside the repository.
set -euo pipefail

CACHE=${CTLD_VM_CACHE:-/var/cache/ctld-vm}
# The current gVisor (issue 27): a Go pseudo-version of gvisor.dev/gvisor's go
# branch. Change it here only; docs/operations.md names it.
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
RUNSC_DIR="$CACHE/runsc-$RUNSC_VERSION"

if [ "${1:-}" = --runsc-dir ]; then
	if [ ! -x "$RUNSC_DIR/runsc" ]; then
		echo "setup: current runsc not built: run test/vm/setup.sh first" >&2
		exit 1
	fi
	echo "$RUNSC_DIR"
	exit 0
fi
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

# The current runsc: built once per version (2-3 minutes, most of it
# compiling), then cached. go install checks every module it downloads
# against go.sum's checksum database (GOSUMDB as the machine has it): a
# failed download or a checksum mismatch fails the setup here, loudly; there
# is no fallback to Debian's runsc.
if [ ! -x "$RUNSC_DIR/runsc" ]; then
	GO=${GO:-go}
	if ! command -v "$GO" >/dev/null; then
		log "cannot build the current runsc: no Go toolchain ($GO) on PATH"
		exit 1
	fi
	log "building runsc gvisor.dev/gvisor@$RUNSC_VERSION (a few minutes, once)"
	rtmp=$(mktemp -d "$CACHE/.runsc.XXXXXX")
	if ! (cd "$rtmp" && CGO_ENABLED=0 GOBIN="$rtmp/bin" "$GO" install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2); then
		rm -rf "$rtmp"
		log "FAILED to build runsc gvisor.dev/gvisor/runsc@$RUNSC_VERSION (module download or checksum verification failed, see above)"
		exit 1
	fi
	"$rtmp/bin/runsc" --version >&2
	rm -rf "$RUNSC_DIR"
	mv "$rtmp/bin" "$RUNSC_DIR"
	rm -rf "$rtmp"
	log "current runsc installed in $RUNSC_DIR"
fi
echo "$dir"
