#!/usr/bin/env bash
# The ctld demo: two instances, a real gVisor sandbox, a kill -9 failover,
# and a verified cleanup proof. Runs as root on a host where `ctld doctor`
# passes (the test VM is one). Binaries from $CTLD_BIN_DIR.
set -euo pipefail
BIN=${CTLD_BIN_DIR:?set CTLD_BIN_DIR to the directory holding ctld and ctl-manager}
export PATH="$BIN:$PATH"
export CTL_MANAGER_DB=${CTL_MANAGER_DB:-/var/lib/ctl-manager/manager.db}
mkdir -p "$(dirname "$CTL_MANAGER_DB")"
LOGS=$(mktemp -d)
t0=${EPOCHREALTIME/./}
step() { printf '\n[%5.1fs] ==> %s\n' "$(( (${EPOCHREALTIME/./} - t0) / 1000 ))e-3" "$*"; }
now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

wait_primary() { # slot
	for _ in $(seq 1 600); do
		if ctld status --json 2>/dev/null | grep -q "\"slot\":\"$1\",\"role\":\"primary\",\"epoch\":[0-9]*,\"health\":\"ok\""; then
			ctl-manager node status >/dev/null 2>&1 && return 0
		fi
		sleep 0.05
	done
	echo "ctld@$1 did not become primary; logs:"; cat "$LOGS"/*.log; return 1
}

step "ctld doctor: is this a sandbox host?"
ctld doctor

step "start ctld@a, then ctld@b (one primary by flock, the other standby)"
ctld run --slot a >"$LOGS/a.log" 2>&1 & A=$!; pids+=("$A")
wait_primary a
ctld run --slot b >"$LOGS/b.log" 2>&1 & B=$!; pids+=("$B")
sleep 0.5
ctld status

step "node status (identity, epoch, capacity)"
ctl-manager node status

step "create sandbox 'demo' from the busybox template (lease, overlay root, netns, runsc, readiness proof)"
ctl-manager sandbox create demo --cpu 500m --memory 256Mi --pids 256

step "exec in the guest"
ctl-manager sandbox exec demo -- /bin/sh -c 'echo "hello from $(hostname), kernel $(uname -r) (gVisor)"; id'

step "write a file through the API, read it back, and read it from the guest"
echo "written by ctl-manager at $(date -u +%T)" | ctl-manager sandbox file put demo /root/hello.txt -
ctl-manager sandbox file get demo /root/hello.txt
ctl-manager sandbox exec demo -- /bin/cat /root/hello.txt

step "kill -9 the primary (ctld@a) while the guest runs"
k=$(now_ms)
kill -9 "$A"
wait_primary b
echo "standby ctld@b serving after $(( $(now_ms) - k )) ms"
ctld status

step "the same sandbox, served by ctld@b: the guest kept running"
ctl-manager sandbox get demo
ctl-manager sandbox exec demo -- /bin/cat /root/hello.txt

step "restart ctld@a: it joins as standby (no failback)"
ctld run --slot a >"$LOGS/a2.log" 2>&1 & pids+=("$!")
sleep 0.5
ctld status

step "destroy the sandbox: cleanup proof, signed by the node key, verified"
out=$(ctl-manager --json sandbox destroy demo)
op=$(echo "$out" | sed -n "s/.*\"operation_id\": *\"\([^\"]*\)\".*/\1/p" | head -1)
echo "destroyed: release operation $op"
ctl-manager proof verify "$op"
ctl-manager sandbox ls

step "nothing left: runsc containers, lease cgroups, netns"
echo "runsc containers: $(runsc --root /run/ctld/runsc list -quiet | wc -l)"
echo "lease cgroups:    $(find /sys/fs/cgroup/ctld.slice -mindepth 1 -type d | wc -l)"
echo "ctld netns:       $(ls /run/netns 2>/dev/null | grep -c '^ctld-' || true)"

step "done"
