#!/usr/bin/env bash
# Installs, idempotently, mmdebstrap (Debian's), which `ctl-manager
# template build` runs to make a recipe's tree, and builds the trees of
# the shipped recipes (templates/*.toml) into the recipe cache
# (CTLD_RECIPE_CACHE, default /var/cache/ctld-recipes) from the Debian
# mirror: the test VM has no mirror, so its tests build the templates from
# these cached trees (a cache hit by the recipe's digest). A tree already
# cached is not built again: a second run takes seconds. Needs root.
# Prints the cache directory on stdout; everything else goes to stderr.
set -euo pipefail

log() { echo "recipe-setup: $*" >&2; }

cache=${CTLD_RECIPE_CACHE:-/var/cache/ctld-recipes}
if [ "$(id -u)" != 0 ]; then
	log "needs root (apt-get, mmdebstrap's root mode)"
	exit 1
fi
if ! command -v mmdebstrap >/dev/null; then
	# Serialize with the other setup scripts: all use apt.
	mkdir -p "${CTLD_VM_CACHE:-/var/cache/ctld-vm}"
	exec 9>"${CTLD_VM_CACHE:-/var/cache/ctld-vm}/.lock"
	flock 9
	log "installing mmdebstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >&2
	exec 9>&-
fi

cd "$(dirname "$0")/../.."
mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/ctl-manager" ./cmd/ctl-manager
for r in templates/*.toml; do
	name=$(basename "$r" .toml)
	# A throwaway store: only the cached tree is kept.
	log "tree of $r"
	"$work/ctl-manager" template build "$name" -f "$r" --cache "$cache" --store "$work/store" --node-key "$work/node.key" \
		--tmp-dir "$work" >&2
done
echo "$cache"
