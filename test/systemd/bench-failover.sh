#!/usr/bin/env bash
# The failover benchmark under the installed units: run by `make
# bench-systemd` inside the test VM with systemd as PID 1 (test/vm/vmrun
# -systemd). BenchmarkFailover (test/e2e, prebuilt as bin/e2e.test) drives
# ctld@a and ctld@b with systemctl and kill -9 of the primary's MainPID;
# systemd restarts the killed instance (Restart=always), which rejoins as
# standby. State in /var/lib/ctld (the VM's XFS disk), sockets in /run/ctld.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
dpkg -i "$CTLD_DEB" >/dev/null || exit 1 # the package vmrun built (make deb)
CTLD_BENCH_SYSTEMD=1 bin/e2e.test -test.run '^$' -test.bench '^BenchmarkFailover$' -test.benchtime 1x -test.v -test.timeout 50m
rc=$?
systemctl stop ctld.target ctld@a ctld@b
journalctl --no-pager -o short-monotonic -u 'ctld@*' | grep -E 'reconciled|takeover_ms|level=(WARN|ERROR)' | tail -n 80
exit $rc
