#!/usr/bin/env bash
# The systemd units under test, for real: run by `make test-systemd` inside
# the test VM with systemd as PID 1 (test/vm/vmrun -systemd). It plays the
# operator: installs ctld's Debian package ($CTLD_DEB, `make deb`) with
# dpkg, starts ctld@a and ctld@b,
# claims a sandbox, kills the primary with -9 and checks that the standby
# adopts the running guest and that the host (PID 1's mount namespace) sees
# the guest's mounts and netns; then the watchdog, readiness, OOM score,
# `systemctl stop ctld.target` and `ctld status` under systemd; a non-root
# operator in group ctld, and one outside it; last the package's removal
# (refused under a live sandbox, then nothing left running) and purge.
# Every check is printed; the script exits 1 if any failed.
set -uo pipefail
export CTL_MANAGER_DB=/var/lib/ctl-manager/manager.db
REPO=$(pwd)
t0=${EPOCHREALTIME/./}
failed=0
step() { printf '\n[%6.1fs] ==> %s\n' "$(((${EPOCHREALTIME/./} - t0) / 1000))e-3" "$*"; }
ok() { echo "  ok:   $*"; }
bad() {
	echo "  FAIL: $*"
	failed=$((failed + 1))
}
# check DESCRIPTION COMMAND...: a check that passes when COMMAND succeeds.
check() {
	local what=$1
	shift
	if "$@"; then ok "$what"; else bad "$what"; fi
}
fatal() {
	bad "$*"
	finish
}
finish() {
	step "journal of the ctld units"
	journalctl --no-pager -o short-monotonic -u 'ctld@*' | tail -n 120
	step "result: $failed failed check(s)"
	[ "$failed" = 0 ] && exit 0
	exit 1
}
mainpid() { systemctl show -p MainPID --value "ctld@$1"; }
# primary_slot prints the slot that is primary and healthy, if any.
primary_slot() {
	ctld status --json 2>/dev/null |
		jq -r '.slots[] | select(.status.role == "primary" and .status.health == "ok") | .slot'
}
wait_primary() { # [not-slot] -> slot, within 120 s
	local s
	for _ in $(seq 1 1200); do
		s=$(primary_slot)
		if [ -n "$s" ] && [ "$s" != "${1:-}" ] && ctl-manager node status >/dev/null 2>&1; then
			echo "$s"
			return 0
		fi
		sleep 0.1
	done
	return 1
}
other() { if [ "$1" = a ]; then echo b; else echo a; fi; }
node_field() { ctl-manager --json sandbox get demo 2>/dev/null | jq -r ".node.$1 // empty"; }
node_state() { node_field state; }
# guest_pid prints the runsc sandbox PID of the one live container.
guest_pid() { runsc --root /run/ctld/runsc list -format json 2>/dev/null | jq -r '.[0].pid // empty'; }
host_sees() { # what the host (PID 1's mount namespace) sees of the guest $CID
	ip netns list | grep -q "^ctld-$CID\b" &&
		findmnt -l -n -t overlay -o TARGET | grep -qx "/var/lib/ctld/scratch/$CID/root"
}

step "install the package: dpkg -i $CTLD_DEB"
dpkg-deb -f "$CTLD_DEB" Package Version Depends
dpkg -i "$CTLD_DEB" || fatal "dpkg -i $CTLD_DEB"
check "dpkg has ctld installed" sh -c "dpkg -s ctld | grep -qx 'Status: install ok installed'"
check "ctld and ctl-manager are /usr/bin's" test "$(command -v ctld) $(command -v ctl-manager) $(command -v ctl-agent)" = "/usr/bin/ctld /usr/bin/ctl-manager /usr/bin/ctl-agent"
check "nothing of make install: no unit in /etc/systemd/system" sh -c "! ls /etc/systemd/system/ctld* /etc/systemd/system/ctl-manager.service 2>/dev/null"
for f in ctld@.service ctld.target; do
	check "/lib/systemd/system/$f is systemd/$f" cmp "/lib/systemd/system/$f" "$REPO/systemd/$f"
done
check "/etc/ctld/ctld.toml is ctld config default, a conffile" sh -c "ctld config default | cmp - /etc/ctld/ctld.toml && dpkg-query -W -f '\${Conffiles}' ctld | grep -q '^ /etc/ctld/ctld.toml '"
check "the install started nothing" test "$(systemctl is-active ctld@a ctld@b ctl-manager | sort -u)" = inactive
owners=$(stat -c '%n %U:%G %a' /run/ctld /var/lib/ctl-manager | tr '\n' ' ')
check "postinst made the directories (tmpfiles): $owners" test "$owners" = "/run/ctld root:ctld 750 /var/lib/ctl-manager root:ctld 2770 "
check "the scenario runs in PID 1's mount namespace" test "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)"
check "cgroup2 is the only hierarchy" test "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs
check "group ctld exists (sysusers)" getent group ctld
check "nbd loaded with the shipped nbds_max=64" test "$(cat /sys/module/nbd/parameters/nbds_max 2>/dev/null)" = 64

# Files of other owners live in the state dir (a guest's overlay upper):
# starting the units must not chown them.
install -d -o 1000 -g 1000 /var/lib/ctld/owner-probe

step "the configuration file and env file the units read"
# The shipped default with one setting uncommented: the units read it from
# its default path; the env file (secrets) reaches ctld's environment.
install -d -m 0755 /etc/ctld
ctld config default | sed 's/^#log-level = "info"$/log-level = "debug"/' >/etc/ctld/ctld.toml
check "the default file names log-level" grep -qx 'log-level = "debug"' /etc/ctld/ctld.toml
install -m 0600 /dev/null /etc/ctld/ctld.env
echo SCENARIO_ENV_PROBE=from-env-file >/etc/ctld/ctld.env

step "systemctl start ctld@a (Type=notify: start returns after READY=1)"
systemctl start ctld@a || fatal "systemctl start ctld@a"
check "ctld@a is active" test "$(systemctl is-active ctld@a)" = active
# READY=1 is sent once the probe socket listens, so it answers right away.
check "ctld@a's probe socket answers as soon as start returns" sh -c 'ctld status --json | jq -e ".slots[] | select(.slot == \"a\") | .status.pid" >/dev/null'
check "ctld@a has the env file's variable" sh -c "tr '\\0' '\\n' </proc/$(mainpid a)/environ | grep -qx SCENARIO_ENV_PROBE=from-env-file"
check "ctld@a's info lines reach journald at priority 6 (info), the <N> prefix stripped" \
	sh -c "journalctl -u ctld@a -p 6..6 -o cat --no-pager | grep -q '^time=.* level=INFO msg=\"standby: waiting for the primary lock\"'"
check "the unit is Type=notify with the watchdog on" test "$(systemctl show -p Type,WatchdogUSec --value ctld@a | tr '\n' ' ')" = "notify 30s "
A=$(wait_primary) || fatal "no primary after starting ctld@a"
check "ctld@a is the primary" test "$A" = a
systemctl start ctld@b || fatal "systemctl start ctld@b"
ctld status

step "each instance runs in the host's namespaces, with the unit's limits"
for s in a b; do
	pid=$(mainpid $s)
	check "ctld@$s (pid $pid) sees PID 1's mount namespace" test "$(readlink /proc/"$pid"/ns/mnt)" = "$(readlink /proc/1/ns/mnt)"
	check "ctld@$s oom_score_adj is -900" test "$(cat /proc/"$pid"/oom_score_adj)" = -900
	cg=/sys/fs/cgroup/system.slice/system-ctld.slice/ctld@$s.service
	check "ctld@$s memory is bounded: memory.high $(cat $cg/memory.high) memory.max $(cat $cg/memory.max)" \
		test "$(cat $cg/memory.high) $(cat $cg/memory.max)" = "$((3 << 30)) $((4 << 30))"
	check "ctld@$s may open /dev/nbd0 (no device allow-list)" sh -c "echo \$\$ > /sys/fs/cgroup/system.slice/system-ctld.slice/ctld@$s.service/cgroup.procs && exec 3<>/dev/nbd0"
done
check "ctld status shows each unit's main PID" sh -c "ctld status --json | jq -e '[.slots[] | .status.pid] == [$(mainpid a), $(mainpid b)]' >/dev/null"
owners=$(stat -c '%n %U:%G %a' /run/ctld /var/lib/ctld | tr '\n' ' ')
check "/run/ctld and /var/lib/ctld keep root:ctld 750 (tmpfiles), so group ctld reaches the socket: $owners" \
	test "$owners" = "/run/ctld root:ctld 750 /var/lib/ctld root:ctld 750 "
check "a file of uid 1000 in the state dir keeps its owner: $(stat -c %u:%g /var/lib/ctld/owner-probe)" \
	test "$(stat -c %u:%g /var/lib/ctld/owner-probe)" = 1000:1000
rmdir /var/lib/ctld/owner-probe
echo "  device policy of ctld@a: $(systemctl show -p DevicePolicy,DeviceAllow ctld@a | tr '\n' ' ')"

step "claim a sandbox"
ctl-manager sandbox create demo --cpu 500m --memory 256Mi --pids 256 || fatal "claim"
check "the guest answers" ctl-manager sandbox exec demo -- /bin/true
check "log-level = debug from /etc/ctld/ctld.toml: runsc's debug lines in the journal at priority 7" \
	sh -c "journalctl -u 'ctld@*' -p 7..7 -o cat --no-pager | grep -q 'level=DEBUG msg=runsc'"
check "no journal line of ctld keeps a <N> prefix" sh -c "! journalctl -u 'ctld@*' -o cat --no-pager | grep -q '^<[0-9]>'"
CID=$(node_field container_id)
GUEST=$(guest_pid)
echo "container $CID, lease $(node_field lease_id), runsc sandbox pid $GUEST"
ip netns list
findmnt -t overlay
check "runsc shows the guest (pid $GUEST)" test -n "$GUEST"
check "the host sees the guest's netns (ip netns) and overlay root (findmnt)" host_sees
LEASE=$(node_field lease_id)
LEASEDIR=/sys/fs/cgroup/ctld.slice/$LEASE
check "the guest runs in its lease cgroup $LEASEDIR, not in a unit's" grep -qx "$GUEST" "$LEASEDIR/cgroup.procs"
for s in a b; do
	check "ctld@$s's unit cgroup holds only ctld" test "$(cat /sys/fs/cgroup/system.slice/system-ctld.slice/ctld@$s.service/cgroup.procs)" = "$(mainpid $s)"
done

step "kill -9 the primary's main PID: the standby adopts the running guest"
k=${EPOCHREALTIME/./}
kill -9 "$(mainpid "$A")"
B=$(wait_primary "$A") || fatal "no new primary after kill -9 of ctld@$A"
ok "ctld@$B is primary, serving $(((${EPOCHREALTIME/./} - k) / 1000)) ms after the kill"
check "the sandbox is still ready on the node" test "$(node_state)" = ready
check "the same guest process runs (pid $GUEST)" test "$(guest_pid)" = "$GUEST"
check "the adopted guest answers" ctl-manager sandbox exec demo -- /bin/true
check "the host still sees the guest's netns and overlay root" host_sees
for _ in $(seq 1 100); do [ "$(systemctl is-active "ctld@$A")" = active ] && break; sleep 0.1; done
check "systemd restarted ctld@$A (Restart=always) and it is standby" sh -c "ctld status --json | jq -e '.slots[] | select(.slot == \"$A\") | .status.role == \"standby\"' >/dev/null"
ctld status

step "systemd re-applies its cgroup tree: ctld.slice keeps its controllers"
systemctl daemon-reexec
check "the lease still has cpu, memory and pids" sh -c "tr ' ' '\n' < $LEASEDIR/cgroup.controllers | grep -cxE 'cpu|memory|pids' | grep -qx 3"
check "the lease's memory.max is still 256Mi" test "$(cat "$LEASEDIR/memory.max")" = 268435456

step "systemctl stop ctld.target: ctld stops, guests keep running (KillMode=process)"
systemctl stop ctld.target
check "both instances are inactive" test "$(systemctl is-active ctld@a ctld@b | sort -u)" = inactive
check "the guest process still runs" kill -0 "$GUEST"
check "the host still sees the guest's netns and overlay root" host_sees
systemctl start ctld.target
P=$(wait_primary) || fatal "no primary after systemctl start ctld.target"
check "after start, the sandbox is adopted and ready" test "$(node_state)" = ready
check "the same guest process runs" test "$(guest_pid)" = "$GUEST"
check "the guest answers" ctl-manager sandbox exec demo -- /bin/true

step "watchdog: SIGSTOP the primary ctld@$P; systemd kills it and the standby takes over"
pid=$(mainpid "$P")
k=${EPOCHREALTIME/./}
kill -STOP "$pid"
Q=$(wait_primary "$P") || bad "no takeover within 120 s of SIGSTOP of ctld@$P"
check "ctld@$Q took over, $(((${EPOCHREALTIME/./} - k) / 1000000)) s after the SIGSTOP" test -n "$Q"
check "the journal says systemd's watchdog fired for ctld@$P" sh -c "journalctl --no-pager -u ctld@$P | grep -q 'Watchdog timeout'"
check "the frozen process is gone" sh -c "! kill -0 $pid 2>/dev/null"
check "the guest is adopted again and answers" ctl-manager sandbox exec demo -- /bin/true
ctld status

step "upgrade: dpkg -i the package again while the sandbox runs (postinst restarts standby, then primary)"
ctld status
pa=$(mainpid a)
pb=$(mainpid b)
check "dpkg -i over the installed package" dpkg -i "$CTLD_DEB"
check "both instances were restarted (pids $pa $pb -> $(mainpid a) $(mainpid b))" sh -c "test $(mainpid a) != $pa && test $(mainpid b) != $pb"
U=$(wait_primary) || fatal "no primary after the upgrade"
ctld status
check "the sandbox is still ready on the node" test "$(node_state)" = ready
check "the same guest process runs (pid $GUEST)" test "$(guest_pid)" = "$GUEST"
check "the guest answers after the upgrade" ctl-manager sandbox exec demo -- /bin/true

step "destroy the sandbox: cleanup proof verified, nothing left"
check "destroy with a verified proof" ctl-manager sandbox destroy demo
check "no ctld netns left" sh -c "! ip netns list | grep -q '^ctld-'"
check "no overlay left" sh -c "! findmnt -l -n -t overlay -o TARGET | grep -q /var/lib/ctld/scratch"
check "no lease cgroup left" test -z "$(find /sys/fs/cgroup/ctld.slice -mindepth 1 -type d)"
check "no runsc container left" test -z "$(runsc --root /run/ctld/runsc list -quiet)"

step "non-root operators: members of group ctld use ctl-manager, others are refused"
useradd --no-create-home --shell /usr/sbin/nologin --groups ctld op
useradd --no-create-home --shell /usr/sbin/nologin outsider
refused() { test "$1" = 125 && grep -qi 'permission denied' <<<"$2"; } # RC OUTPUT
db=/var/lib/ctl-manager/manager.db
modes=$(stat -c '%n %G %a' /var/lib/ctl-manager "$db" | tr '\n' ' ')
check "the database dir is group ctld's, setgid, and root's database 0660: $modes" \
	test "$modes" = "/var/lib/ctl-manager ctld 2770 $db ctld 660 "
check "op (group ctld, not root) creates a sandbox" runuser -u op -- ctl-manager sandbox create opbox --cpu 500m --memory 256Mi --pids 256
check "op lists it" sh -c "runuser -u op -- ctl-manager sandbox ls | grep -q opbox"
check "op execs in it" runuser -u op -- ctl-manager sandbox exec opbox -- /bin/true
check "root reads what op wrote" ctl-manager sandbox get opbox
echo "  $(ls -ln /var/lib/ctl-manager | tr '\n' ';')"
out=$(runuser -u outsider -- ctl-manager sandbox ls 2>&1)
rc=$?
check "outsider (not in group ctld): sandbox ls fails (exit $rc, want 125): $out" refused "$rc" "$out"
out=$(runuser -u outsider -- ctl-manager --db /tmp/outsider/manager.db node status 2>&1)
rc=$?
check "outsider with a database of its own: ctld's socket refuses (exit $rc, want 125): $out" refused "$rc" "$out"
check "op destroys it with a verified proof" runuser -u op -- ctl-manager sandbox destroy opbox

step "the service: ctl-manager.service (serve) used with curl and an API key"
check "/lib/systemd/system/ctl-manager.service is systemd/ctl-manager.service" cmp /lib/systemd/system/ctl-manager.service "$REPO/systemd/ctl-manager.service"
systemctl start ctl-manager || fatal "systemctl start ctl-manager"
KEY=$(ctl-manager key create --owner ci 2>/dev/null)
API=http://127.0.0.1:8080/v1
api() { curl -sS -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' "$@"; }
for _ in $(seq 1 100); do api -f "$API/templates" >/dev/null 2>&1 && break; sleep 0.1; done
SB=$(api -X POST -d '{"template":"busybox","timeout_sec":600,"labels":{"run":"scenario"}}' "$API/sandboxes" | jq -r 'select(.state == "ready") | .id')
check "create through the service: ready" test -n "$SB"
check "exec through the service" test "$(api -X POST -d '{"args":["/bin/echo","hi"]}' "$API/sandboxes/$SB/exec" | jq -r .stdout | base64 -d)" = hi
check "a wrong key is 401" test "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer ctl_wrong' "$API/sandboxes")" = 401
check "destroy through the service answers a verified, clean proof" test "$(api -X DELETE "$API/sandboxes/$SB" | jq -r '.proof.verified and .proof.clean')" = true
check "the key is not in the service's journal" sh -c "! journalctl -u ctl-manager --no-pager | grep -qF '$KEY'"
journalctl --no-pager -o short-monotonic -u ctl-manager | tail -n 20
systemctl stop ctl-manager

step "remove the package: refused while a sandbox lives"
ctl-manager sandbox create keep --cpu 500m --memory 256Mi --pids 256 || fatal "claim keep"
dpkg -r ctld >/tmp/dpkg-r.log 2>&1
rc=$?
sed 's/^/    /' /tmp/dpkg-r.log
check "dpkg -r ctld fails (exit $rc)" test "$rc" != 0
# dpkg -r marked it for removal (deinstall), but it is installed and configured.
check "the package stays installed: $(dpkg -s ctld | grep '^Status:')" sh -c "dpkg -s ctld | grep -qxE 'Status: (install|deinstall) ok installed'"
check "prerm says why" grep -q "refusing to remove the package: sandboxes still hold kernel objects" /tmp/dpkg-r.log
wait_primary >/dev/null || fatal "no primary after the refused removal"
check "the units run again and the sandbox answers" ctl-manager sandbox exec keep -- /bin/true
check "destroy keep" ctl-manager sandbox destroy keep

step "apt-get remove ctld: no unit runs, no kernel object of ctld is left"
apt-get remove -y ctld >/tmp/apt-remove.log 2>&1
rc=$?
sed 's/^/    /' /tmp/apt-remove.log
check "apt-get remove -y ctld (exit $rc)" test "$rc" = 0
check "dpkg keeps only its config files" sh -c "dpkg -s ctld | grep -qx 'Status: deinstall ok config-files'"
check "no ctld or ctl-manager unit is active" test -z "$(systemctl list-units --state=active --plain --no-legend 'ctld@*' ctld.target 'ctl-manager*')"
check "no ctld or ctl-manager process" sh -c "! pgrep -x 'ctld|ctl-manager'"
check "no runsc process" sh -c "! pgrep runsc"
check "no ctld netns" sh -c "! ip netns list | grep -q '^ctld-'"
check "no mount under /var/lib/ctld or /run/ctld" sh -c "! findmnt -l -n -o TARGET | grep -qE '^/(var/lib|run)/ctld/'"
check "no lease cgroup, and ctld.slice is gone" test ! -e /sys/fs/cgroup/ctld.slice
check "no nft table inet ctld" sh -c "! nft list table inet ctld 2>/dev/null"
check "no NBD device connected" sh -c "! ls /sys/block/nbd*/pid 2>/dev/null"
check "/run/ctld is gone" test ! -e /run/ctld
check "the binaries are gone" test ! -e /usr/bin/ctld -a ! -e /usr/bin/ctl-manager
check "the conffile stays" test -e /etc/ctld/ctld.toml

step "dpkg --purge ctld: configuration gone, data kept"
check "dpkg --purge ctld" dpkg --purge ctld
check "/etc/ctld is gone (config and env file)" test ! -e /etc/ctld
check "dpkg no longer knows ctld" sh -c "! dpkg -s ctld >/dev/null 2>&1"
check "the state dir and the manager's database are kept" test -d /var/lib/ctld/ha -a -e /var/lib/ctl-manager/manager.db
check "group ctld is kept" getent group ctld
finish
