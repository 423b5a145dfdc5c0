package main

import (
	"fmt"
	"strings"
)

// initModules are loaded by the initramfs, in this order, to reach the
// host's root over virtio-9p and put a tmpfs overlay over it.
var initModules = []string{
	"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
	"virtio_pci", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p", "overlay",
}

// guestModules are what a sandbox host needs; the guest script modprobes them
// and the kernel tests fail if one is missing.
var guestModules = []string{
	"nbd nbds_max=16", "nf_tables", "nft_chain_nat", "nft_ct", "nft_nat", "nft_masq",
	"nft_reject_inet", "nft_fib_inet", "nf_conntrack_netlink", "veth", "overlay", "xfs", "ext4", "loop", "tun",
}

// initScript is /init of the initramfs (busybox sh). It mounts the host's /
// read-only, a tmpfs upper over it, binds the unpacked kernel's modules and
// the results share, and switches root into the guest script.
func initScript(kver, kdir string) string {
	return fmt.Sprintf(`#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do
	insmod /modules/$m.ko || echo "vm-init: insmod $m failed"
done
if grep -q ctldprobe /proc/cmdline; then
	echo CTLD-PROBE-OK
	poweroff -f
fi
die() { echo "vm-init: $*"; echo CTLD-INIT-FAILED; poweroff -f; }
mkdir -p /hostroot /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /hostroot || die "mount host root"
mount -t tmpfs -o mode=755 tmpfs /rw || die "mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/hostroot,upperdir=/rw/upper,workdir=/rw/work /newroot || die "mount overlay root"
mkdir -p /newroot/lib/modules/%[1]s /newroot/ctld-vm
mount --bind /newroot%[2]s/lib/modules/%[1]s /newroot/lib/modules/%[1]s || die "bind modules"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 ctldvm /newroot/ctld-vm || die "mount results share"
umount /proc /sys
mount --move /dev /newroot/dev || die "move /dev"
exec switch_root /newroot /bin/sh /ctld-vm/guest.sh
`, kver, kdir)
}

// The guest runs binaries from a tmpfs of its own (binDir), not from the
// results share: that 9p mount has no page cache (cache=none), so every
// exec of a binary there reads all of it over 9p again (ctld, 20 MB: 1.6-
// 3.7 s an exec under TCG; an e2e test starts ctld, its log writers and
// ctl-manager dozens of times). shareBinDir is the share's bin dir in the
// guest.
const (
	binDir      = "/ctld-bin"
	shareBinDir = "/ctld-vm/bin"
)

// Job is one program the guest runs as root: a test binary or a command.
type Job struct {
	Name    string   // shown in the summary (a package path for tests)
	Dir     string   // working directory in the guest (same path as on the host)
	Argv    []string // program and arguments
	IsTest  bool     // output is `go test -v` output to count
	IsBench bool     // output is `go test -v -bench` output to count
	Timeout int      // seconds
	// Stage, if set, is copied to Argv[0] before the job and removed
	// after it (a test binary: one at a time, so the tmpfs stays small).
	Stage string
}

// guestScript is run by the guest as PID 1 after switch_root.
func guestScript(jobs []Job, env []string) string {
	var b strings.Builder
	b.WriteString(`#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin
export HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# /tmp stays the host's (read-only lower, tmpfs upper) so a checkout under
# /tmp is visible at the same path; tests get a fresh tmpfs as TMPDIR, which
# can also be an overlay upper.
mkdir -p /ctld-tmp
mount -t tmpfs -o mode=1777 tmpfs /ctld-tmp
export TMPDIR=/ctld-tmp
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /dev/pts /dev/shm /run/netns /var/lib/ctld /var/tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# ctld's state dir is a real disk (XFS with project quotas, as on a host):
# fsync, disk leases and overlay uppers behave as they do in production.
modprobe virtio_blk
modprobe xfs
if [ -b /dev/vda ] && mkfs.xfs -q -f /dev/vda && mount -o prjquota /dev/vda /var/lib/ctld; then
	:
else
	echo "vm: cannot make the state disk (/dev/vda, XFS, prjquota) for /var/lib/ctld"
	echo CTLD-INIT-FAILED
fi
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup || echo "vm: cannot mount cgroup2"
for c in cpu memory pids cpuset io; do
	echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || echo "vm: cannot enable cgroup controller $c"
done
`)
	for _, m := range guestModules {
		fmt.Fprintf(&b, "modprobe %s || echo \"vm: modprobe %s failed\"\n", m, strings.Fields(m)[0])
	}
	b.WriteString(reapFunc)
	b.WriteString(`ip link set lo up
hostname ctld-vm
mkdir -p /ctld-vm/out
mkdir -p ` + binDir + `
mount -t tmpfs -o mode=755 tmpfs ` + binDir + `
[ ! -d ` + shareBinDir + `/cmd ] || cp -a ` + shareBinDir + `/cmd ` + binDir + `/cmd || echo "vm: cannot copy the binaries to ` + binDir + `"
echo CTLD-GUEST-UP
`)
	for _, e := range env {
		fmt.Fprintf(&b, "export %s\n", shellQuote(e))
	}
	for i, j := range jobs {
		fmt.Fprintf(&b, "echo '=== vm job %d: %s'\n", i, strings.ReplaceAll(j.Name, "'", ""))
		stage := ""
		if j.Stage != "" {
			stage = fmt.Sprintf("cp %s %s && ", shellQuote(j.Stage), shellQuote(j.Argv[0]))
		}
		fmt.Fprintf(&b, "(%scd %s && timeout -k 10 %d %s; echo $? > /ctld-vm/out/%d.rc) 2>&1 | tee /ctld-vm/out/%d.log\n",
			stage, shellQuote(j.Dir), j.Timeout, shellJoin(j.Argv), i, i)
		if j.Stage != "" {
			fmt.Fprintf(&b, "rm -f %s\n", shellQuote(j.Argv[0]))
		}
		fmt.Fprintf(&b, "vm_reap %d\n", i)
	}
	b.WriteString(`dmesg -l err,crit,alert,emerg > /ctld-vm/dmesg.txt 2>&1
echo done > /ctld-vm/done
sync
echo CTLD-GUEST-DONE
busybox poweroff -f || echo o > /proc/sysrq-trigger
`)
	return b.String()
}

// reapFunc defines vm_reap N, run after job N: a test binary killed at
// its timeout (or one that leaked) leaves its children running (ctlds,
// guests, PostgreSQL), and they would hold ports, nft tables and CPU in
// every later job, failing tests that have nothing to do with them. Each
// job starts from a guest with no user process but the script (PID 1);
// what is killed is named, so a leak still shows.
const reapFunc = `vm_reap() {
	n=0
	for p in /proc/[0-9]*; do
		pid=${p#/proc/}
		[ "$pid" -gt 1 ] || continue
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[ -n "$exe" ] || continue
		kill -9 "$pid" 2>/dev/null || continue
		n=$((n + 1))
		[ "$n" -gt 20 ] || echo "vm: job $1 left process $pid ($exe): killed"
	done
	[ "$n" -eq 0 ] && return
	echo "vm: job $1 left $n processes; killed them, flushed nft and removed named netns"
	sleep 1
	nft flush ruleset 2>/dev/null
	for ns in /run/netns/*; do [ -e "$ns" ] && ip netns delete "${ns##*/}" 2>/dev/null; done
	return 0
}
`

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}
