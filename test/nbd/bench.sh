#!/usr/bin/env bash
# The NBD benchmark of issue 9, on the host: our server (nbdsrv serving a
# cowdev over a block-store generation, the writer's stack) against
# qemu-nbd serving a qcow2 overlay whose backing file is the same raw base,
# both on a Unix socket, back to back in one run:
#   - nbdcopy sequential read of the whole device to null: (goal >= 1.0x)
#   - fio randread 4 KiB, iodepth 16, fixed time, nbd engine (goal >= 0.8x)
# Ours is measured cold (fresh cowdev and an empty node base cache: every
# chunk fetched from the store, authenticated, decoded, and left in the
# base cache), node-warm (a fresh cowdev over the base cache the cold pass
# filled: the next sandbox of the template on this node) and warm (the
# cold device's second pass).
# Both servers read their base through the page cache (the base image and
# the store are written just before; nothing is dropped).
#   make bench-nbd     (root: test/nbd/setup.sh --bench installs fio etc.)
# Prints each round and the medians (BENCH_ROUNDS, default 3).
# Env: BENCH_SIZE (bytes, default 1 GiB), BENCH_FIO_SECONDS (default 10),
# BENCH_DIR (work directory, default a fresh one under /var/tmp, removed),
# BENCH_BASE_CACHE (1, the default, serves with a node base cache as ctld's
# writers do; 0 without: node-warm is then a second cold pass),
# BENCH_COMPRESS (the chunks' compression at import: s2, the default as for
# templates, zstd or none).
set -euo pipefail

size=${BENCH_SIZE:-$((1 << 30))}
secs=${BENCH_FIO_SECONDS:-10}
rounds=${BENCH_ROUNDS:-3}
cd "$(dirname "$0")/../.."

for t in nbdcopy fio qemu-nbd qemu-img; do
	command -v "$t" >/dev/null || { echo "bench-nbd: $t missing: run test/nbd/setup.sh --bench" >&2; exit 1; }
done
fio --enghelp 2>/dev/null | grep -qx '[[:space:]]*nbd' || { echo "bench-nbd: this fio has no nbd engine" >&2; exit 1; }

own_dir=
if [ -z "${BENCH_DIR:-}" ]; then
	BENCH_DIR=$(mktemp -d /var/tmp/ctld-nbdbench.XXXXXX)
	own_dir=1
fi
w=$BENCH_DIR
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "$own_dir" ]; then rm -rf "$w"; fi
}
trap cleanup EXIT

go build -o "$w/benchsrv" ./test/nbd/benchsrv
"$w/benchsrv" gen -image "$w/base.raw" -size "$size"
"$w/benchsrv" import -compress="${BENCH_COMPRESS:-s2}" \
	-store "$w/store" -key "$w/node.key" -name bench -image "$w/base.raw"
qemu-img create -q -f qcow2 -b "$w/base.raw" -F raw "$w/overlay.qcow2"
echo "base: $(du -h --apparent-size "$w/base.raw" | cut -f1) apparent, $(du -h "$w/base.raw" | cut -f1) allocated; store $(du -sh "$w/store" | cut -f1)"

wait_sock() {
	for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done
	echo "bench-nbd: no socket $1" >&2; exit 1
}
start_qemu() {
	rm -f "$w/q.sock"
	qemu-nbd --persistent -k "$w/q.sock" -f qcow2 "$w/overlay.qcow2" &
	pids+=($!); qpid=$!
	wait_sock "$w/q.sock"
}
bc=()
if [ "${BENCH_BASE_CACHE:-1}" != 0 ]; then bc=(-base-cache "$w/basecache"); fi
# start_ours [fresh]: a fresh device; "fresh" empties the node base cache too.
start_ours() {
	rm -rf "$w/dev" "$w/o.sock"
	if [ "${1:-}" = fresh ]; then rm -rf "$w/basecache"; fi
	"$w/benchsrv" serve -store "$w/store" -key "$w/node.key" -name bench -dir "$w/dev" -socket "$w/o.sock" "${bc[@]}" >/dev/null &
	pids+=($!); opid=$!
	wait_sock "$w/o.sock"
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
uri() { echo "nbd+unix:///?socket=$1"; }

# nbdcopy_secs URI: seconds to copy the whole device to null:.
nbdcopy_secs() {
	local t0 t1
	t0=$(date +%s.%N)
	nbdcopy "$(uri "$1")" null: || return 1
	t1=$(date +%s.%N)
	echo "$t1 - $t0" | bc -l
}
# fio_iops SOCK: read IOPS of randread 4k iodepth 16 for $secs seconds.
fio_iops() {
	fio --name=randread --exitall_on_error=1 --ioengine=nbd --uri="$(uri "$1")" --rw=randread --bs=4k --iodepth=16 \
		--size="$size" --runtime="$secs" --time_based --randseed=7 --output-format=json --output="$w/fio.json" >/dev/null || return 1
	jq -e '.jobs[0].error == 0' "$w/fio.json" >/dev/null || { echo "bench-nbd: fio: I/O errors" >&2; return 1; }
	jq '.jobs[0].read.iops | floor' "$w/fio.json"
}
# cpu PID: CPU seconds (user + system) the process has used; the servers'
# CPU per pass is a figure the host's load does not skew.
cpu() { awk '{printf "%.2f\n", ($14 + $15) / 100}' "/proc/$1/stat"; }
mibs() { echo "scale=0; $size / 1048576 / $1" | bc -l; }
ratio() { echo "scale=2; $1 / $2" | bc -l; }

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# A failed copy or fio run (an I/O error: wrong data is never counted)
# ends the run: plain assignments, so set -e sees the failure.
# Rounds alternate the servers so drift in the host's load hits both.
qc=(); oc=(); on=(); ow=(); qi=(); oic=(); oin=(); oiw=(); qcpu=(); occpu=(); oncpu=(); owcpu=()
for r in $(seq "$rounds"); do
	start_qemu
	c0=$(cpu "$qpid")
	t=$(nbdcopy_secs "$w/q.sock"); qc+=("$t")
	qcpu+=("$(echo "$(cpu "$qpid") - $c0" | bc)")
	t=$(fio_iops "$w/q.sock"); qi+=("$t")
	stop "$qpid"
	start_ours fresh
	c0=$(cpu "$opid")
	t=$(nbdcopy_secs "$w/o.sock"); oc+=("$t")
	c1=$(cpu "$opid")
	t=$(nbdcopy_secs "$w/o.sock"); ow+=("$t")
	occpu+=("$(echo "$c1 - $c0" | bc)")
	owcpu+=("$(echo "$(cpu "$opid") - $c1" | bc)")
	t=$(fio_iops "$w/o.sock"); oiw+=("$t")
	stop "$opid"
	start_ours
	c0=$(cpu "$opid")
	t=$(nbdcopy_secs "$w/o.sock"); on+=("$t")
	oncpu+=("$(echo "$(cpu "$opid") - $c0" | bc)")
	t=$(fio_iops "$w/o.sock"); oin+=("$t")
	stop "$opid"
	start_ours fresh
	t=$(fio_iops "$w/o.sock"); oic+=("$t")
	stop "$opid"
	printf 'round %d: nbdcopy s: qemu %.2f ours cold %.2f node-warm %.2f warm %.2f (server CPU s: %.2f, %.2f, %.2f, %.2f) | fio IOPS: qemu %d ours cold %d node-warm %d warm %d\n' \
		"$r" "${qc[-1]}" "${oc[-1]}" "${on[-1]}" "${ow[-1]}" "${qcpu[-1]}" "${occpu[-1]}" "${oncpu[-1]}" "${owcpu[-1]}" "${qi[-1]}" "${oic[-1]}" "${oin[-1]}" "${oiw[-1]}"
done
q_copy=$(median "${qc[@]}"); o_copy_cold=$(median "${oc[@]}"); o_copy_node=$(median "${on[@]}"); o_copy_warm=$(median "${ow[@]}")
q_iops=$(median "${qi[@]}"); o_iops_cold=$(median "${oic[@]}"); o_iops_node=$(median "${oin[@]}"); o_iops_warm=$(median "${oiw[@]}")

mib=$((size >> 20))
echo "medians of $rounds rounds (base cache: $([ ${#bc[@]} -gt 0 ] && echo on || echo off)):"
printf 'nbdcopy seq read %d MiB   qemu-nbd qcow2 %6.2fs %5d MiB/s | ours cold %6.2fs %5d MiB/s (%sx) | node-warm %6.2fs %5d MiB/s (%sx) | warm %6.2fs %5d MiB/s (%sx)  goal >= 1.0x\n' \
	"$mib" "$q_copy" "$(mibs "$q_copy")" "$o_copy_cold" "$(mibs "$o_copy_cold")" "$(ratio "$q_copy" "$o_copy_cold")" \
	"$o_copy_node" "$(mibs "$o_copy_node")" "$(ratio "$q_copy" "$o_copy_node")" \
	"$o_copy_warm" "$(mibs "$o_copy_warm")" "$(ratio "$q_copy" "$o_copy_warm")"
printf 'fio randread 4k qd16 %ds   qemu-nbd qcow2 %6d IOPS | ours cold %6d IOPS (%sx) | node-warm %6d IOPS (%sx) | warm %6d IOPS (%sx)  goal >= 0.8x\n' \
	"$secs" "$q_iops" "$o_iops_cold" "$(ratio "$o_iops_cold" "$q_iops")" "$o_iops_node" "$(ratio "$o_iops_node" "$q_iops")" "$o_iops_warm" "$(ratio "$o_iops_warm" "$q_iops")"
printf 'server CPU per nbdcopy pass  qemu-nbd %.2fs | ours cold %.2fs | node-warm %.2fs | warm %.2fs\n' \
	"$(median "${qcpu[@]}")" "$(median "${occpu[@]}")" "$(median "${oncpu[@]}")" "$(median "${owcpu[@]}")"
