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
WEB_LINK=demo-web0 WEB_ADDR=192.0.2.10
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	ip link del "$WEB_LINK" 2>/dev/null || true
}
trap cleanup EXIT

# wait_for SECONDS WHAT CMD...: polls CMD until it succeeds and says what
# it waited for and how long; gives up after SECONDS, saying what it waited
# for, with ctld's logs.
wait_for() {
	local limit=$1 what=$2 start=$SECONDS t=${EPOCHREALTIME/./}
	shift 2
	until "$@" >/dev/null 2>&1; do
		if (( SECONDS - start >= limit )); then
			echo "demo: gave up after ${limit}s waiting for $what; ctld logs:"
			tail -n 50 "$LOGS"/*.log
			return 1
		fi
		sleep 0.1
	done
	echo "(waited $(( (${EPOCHREALTIME/./} - t) / 1000 )) ms for $what)"
}
is_role() { # slot role
	ctld status --json | grep -q "\"slot\":\"$1\",\"role\":\"$2\",\"epoch\":[0-9]*,\"health\":\"ok\""
}
serving() { # slot
	is_role "$1" primary && ctl-manager --timeout 10s node status
}
wait_primary() { wait_for 120 "ctld@$1 to become primary and serve the API" serving "$1"; }
wait_standby() { wait_for 60 "ctld@$1 to run as standby" is_role "$1" standby; }

step "ctld doctor: is this a sandbox host?"
ctld doctor

step "start ctld@a, then ctld@b (one primary by flock, the other standby)"
ctld run --slot a >"$LOGS/a.log" 2>&1 & A=$!; pids+=("$A")
wait_primary a
ctld run --slot b >"$LOGS/b.log" 2>&1 & B=$!; pids+=("$B")
wait_standby b
ctld status

step "node status (identity, epoch, capacity)"
ctl-manager node status

step "create sandbox 'demo' from the busybox template (lease, overlay root, netns + veth + nft chain, runsc, readiness proof)"
ctl-manager sandbox create demo --cpu 500m --memory 256Mi --pids 256

step "exec in the guest"
ctl-manager sandbox exec demo -- /bin/sh -c 'echo "hello from $(hostname), kernel $(uname -r) (gVisor)"; id'

step "write a file through the API, read it back, and read it from the guest"
echo "written by ctl-manager at $(date -u +%T)" | ctl-manager sandbox file put demo /root/hello.txt -
ctl-manager sandbox file get demo /root/hello.txt
ctl-manager sandbox exec demo -- /bin/cat /root/hello.txt

step "a web server off the node: its own netns at $WEB_ADDR, ports 8080 and 8081 (TEST-NET-1), routed by the node"
# The web host's netns is held by a process, not named with `ip netns add`:
# that would bind-mount /run/netns over itself and hide ctld's netns files
# from ctld (docs/operations.md, troubleshooting).
unshare --net sleep 1d & WEB_PID=$!; pids+=("$WEB_PID")
own_netns() { [ "$(readlink "/proc/$WEB_PID/ns/net")" != "$(readlink /proc/self/ns/net)" ]; }
wait_for 10 "the web host's process to be in a netns of its own" own_netns
web() { nsenter -t "$WEB_PID" -n "$@"; }
ip link add "$WEB_LINK" type veth peer name eth0 netns "$WEB_PID"
ip addr add 192.0.2.1/24 dev "$WEB_LINK" && ip link set "$WEB_LINK" up
web ip addr add "$WEB_ADDR/24" dev eth0 && web ip link set eth0 up && web ip link set lo up
web ip route add default via 192.0.2.1
mkdir -p "$LOGS/www" && echo "hello from the web server at $WEB_ADDR" >"$LOGS/www/index.html"
for port in 8080 8081; do
	nsenter -t "$WEB_PID" -n busybox httpd -f -p "$port" -h "$LOGS/www" & pids+=("$!") # $! is httpd (nsenter execs it)
	wait_for 10 "the web server to listen on $WEB_ADDR:$port" web busybox wget -q -O /dev/null "http://$WEB_ADDR:$port/"
done

# fetch PORT: the guest asks the web server for its page (busybox nc, 3 s
# timeout) and prints the page's line; fails if the page did not come.
fetch() {
	local out
	out=$(ctl-manager sandbox exec demo -- /bin/sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | timeout 5 nc -w 3 $WEB_ADDR $1" 2>&1) || true
	case $out in
	*"hello from the web server"*) echo "reached $WEB_ADDR:$1: ${out##*$'\n'}" ;;
	*) return 1 ;;
	esac
}
reached() { # PORT: the guest must reach the web server on PORT
	fetch "$1" || { echo "demo: the guest did not reach $WEB_ADDR:$1, which its policy allows"; return 1; }
}
refused() { # PORT: the guest must NOT reach the web server on PORT
	if fetch "$1" >/dev/null; then
		echo "demo: the guest reached $WEB_ADDR:$1, which its policy denies"
		return 1
	fi
	echo "not reached, as the policy says: $WEB_ADDR:$1"
}

step "the sandbox's network is deny_all: the web server is not reachable"
refused 8080

step "live policy update: restricted to $WEB_ADDR:8080/tcp; the guest keeps running"
ctl-manager sandbox network demo --mode restricted --allow "$WEB_ADDR/32:8080/tcp"
reached 8080
refused 8081

step "kill -9 the primary (ctld@a) while the guest runs"
k=$(now_ms)
kill -9 "$A"
wait_primary b
echo "standby ctld@b serving after $(( $(now_ms) - k )) ms"
ctld status

step "the same sandbox, served by ctld@b: the guest kept running"
ctl-manager sandbox get demo
ctl-manager sandbox exec demo -- /bin/cat /root/hello.txt
reached 8080
refused 8081

step "back to deny_all, live"
ctl-manager sandbox network demo --mode deny_all
refused 8080

step "restart ctld@a: it joins as standby (no failback)"
ctld run --slot a >"$LOGS/a2.log" 2>&1 & A2=$!; pids+=("$A2")
wait_standby a
ctld status

step "destroy the sandbox: cleanup proof, signed by the node key, verified"
out=$(ctl-manager --json sandbox destroy demo)
op=$(echo "$out" | sed -n "s/.*\"operation_id\": *\"\([^\"]*\)\".*/\1/p" | head -1)
echo "destroyed: release operation $op"
ctl-manager proof verify "$op"
ctl-manager sandbox ls

step "a block-mode template for the service's pause/resume: ctld's busybox tree imported into its block store as busyblk"
ctl-manager template import busyblk /var/lib/ctld/templates/busybox --size 64Mi

step "the service: ctl-manager serve, an API key, the sandbox API with curl"
ctl-manager serve --listen 127.0.0.1:8090 --template busybox --template busyblk:block >"$LOGS/serve.log" 2>&1 & pids+=("$!")
KEY=$(ctl-manager key create --owner demo-team 2>/dev/null)
echo "API key for owner demo-team: ${KEY:0:16}... (shown once; the database keeps its hash)"
ctl-manager owner quota set demo-team --sandboxes 2 --cpu 1 --memory 1Gi --creates-per-min 10
API=http://127.0.0.1:8090/v1
api() { curl -sS --fail-with-body -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' "$@"; }
wait_for 30 "ctl-manager serve to answer" api "$API/templates"
SB=$(api -d '{"template":"busybox","resources":{"cpu":"500m","memory":"256Mi"},"labels":{"demo":"yes"},"timeout_sec":600}' "$API/sandboxes" | jq -r .id)
echo "POST /v1/sandboxes: $SB ready"
echo "exec, streamed (text/event-stream; data is base64):"
api -H 'Accept: text/event-stream' -d '{"args":["/bin/sh","-c","echo streamed from $(hostname); echo to stderr >&2"]}' "$API/sandboxes/$SB/exec"
echo "hello over HTTP" | api -X PUT -H 'Content-Type: application/octet-stream' --data-binary @- "$API/sandboxes/$SB/files?path=/root/api.txt"
echo "GET .../files?path=/root/api.txt: $(api "$API/sandboxes/$SB/files?path=/root/api.txt")"
api -d '{"timeout_sec":1200}' "$API/sandboxes/$SB/timeout" | jq -c '{id, state, ends_at}'
echo "a wrong key gets HTTP $(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer ctl_wrong' "$API/sandboxes/$SB")"
echo "DELETE /v1/sandboxes/$SB, its cleanup proof:"
api -X DELETE "$API/sandboxes/$SB" | jq -c '.proof | {operation_id, verified, clean, checks: [.checks[].name]}'

step "the service: pause and resume a block-mode sandbox; its files are kept"
BLK=$(api -d '{"template":"busyblk","timeout_sec":600}' "$API/sandboxes" | jq -r .id)
echo "POST /v1/sandboxes (template busyblk): $BLK ready"
echo "kept across the pause" | api -X PUT -H 'Content-Type: application/octet-stream' --data-binary @- "$API/sandboxes/$BLK/files?path=/root/kept.txt"
echo "POST .../pause (seal the root, release the compute, cleanup proof):"
api -X POST "$API/sandboxes/$BLK/pause" | jq -c '{id, state, generation}'
echo "POST .../resume (the next generation, from the sealed root):"
api -X POST "$API/sandboxes/$BLK/resume" | jq -c '{id, state, generation}'
echo "GET .../files?path=/root/kept.txt after the resume: $(api "$API/sandboxes/$BLK/files?path=/root/kept.txt")"
api -X DELETE "$API/sandboxes/$BLK" | jq -c '.proof | {operation_id, verified, clean}'

step "a warm pool: ctld@a again, with --warm-pool busybox=1 (a guest booted ahead, agent up, no workload)"
kill "$B" "$A2"
wait "$B" "$A2" 2>/dev/null || true
ctld run --slot a --warm-pool busybox=1 >"$LOGS/a3.log" 2>&1 & A3=$!; pids+=("$A3")
wait_primary a
warm_idle() { [ "$(ctl-manager --json --timeout 10s node status | jq '[.node.warm_pools[]? | select(.template == "busybox") | .idle] | add // 0')" -ge 1 ]; }
wait_for 300 "the warm pool's busybox member to boot and answer its agent" warm_idle
echo "a claim that takes the warm member (no runsc create/start; its agent's claim answer is the readiness proof):"
ctl-manager sandbox create warm1 --cpu 500m --memory 256Mi --pids 256 | grep -E '^timings'
echo "a cold claim of the same spec (the pool is empty: its refill waits until claims are quiet):"
ctl-manager sandbox create cold1 --cpu 500m --memory 256Mi --pids 256 | grep -E '^timings'
echo "pool: $(ctl-manager --json node status | jq -c '.node.warm_pools')"
ctl-manager sandbox destroy warm1 >/dev/null
ctl-manager sandbox destroy cold1 >/dev/null
kill "$A3"
wait "$A3" 2>/dev/null || true
ctld run --slot a >"$LOGS/a4.log" 2>&1 & pids+=("$!")
wait_primary a
echo "ctld@a without a pool took over: the warm member was destroyed with a cleanup proof"

step "nothing left: runsc containers, lease cgroups, netns"
echo "runsc containers: $(runsc --root /run/ctld/runsc list -quiet | wc -l)"
echo "lease cgroups:    $(find /sys/fs/cgroup/ctld.slice -mindepth 1 -type d | wc -l)"
echo "ctld netns:       $(ls /run/netns 2>/dev/null | grep -c '^ctld-' || true)"
echo "sandbox links:    $(ip -o link show | grep -c ': ctl-' || true)"
echo "nft chains:       $(nft list table inet ctld 2>/dev/null | grep -c 'chain sb-' || true)"

step "done"
