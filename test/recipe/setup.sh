#!/usr/bin/env bash
# Installs, idempotently, mmdebstrap (Debian's), which `ctl-manager
# template build` runs to make a recipe's tree, and builds the trees of
# the shipped recipes (templates/*.toml) into the recipe cache
# (CTLD_RECIPE_CACHE, default /var/cache/ctld-recipes) from the Debian
# mirror: the test VM has no mirror, so its tests build the templates from
# these cached trees (a cache hit by the recipe's digest). A tree already
# cached is not built again, nor imported: a second run takes well under a
# second. Needs root.
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
# The trees are named by digests of the recipes that ctl-manager computes;
# a stamp of the recipes and the code that digests them lists the trees
# they named last time: when all are in the cache, there is nothing to
# do, not even building ctl-manager (a cached run is a fraction of a second).
stamp="$cache/.setup-$(cat templates/*.toml $(ls internal/recipe/*.go | grep -v _test.go) | sha256sum | cut -c1-32)"
if [ -f "$stamp" ]; then
	ok=1
	while read -r d; do
		[ -f "$d/recipe.json" ] || ok=0
	done <"$stamp"
	if [ "$ok" = 1 ]; then
		log "trees of templates/*.toml in the cache"
		echo "$cache"
		exit 0
	fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/ctl-manager" ./cmd/ctl-manager
: >"$work/stamp"
for r in templates/*.toml; do
	name=$(basename "$r" .toml)
	# Only the tree, into the cache (built when it is not there): no
	# template, so a cached tree costs nothing.
	out=$("$work/ctl-manager" template build "$name" -f "$r" --cache "$cache" --tree-only)
	log "$out"
	root=${out##*, }
	dirname "$root" >>"$work/stamp"
done
mv "$work/stamp" "$stamp"
echo "$cache"
