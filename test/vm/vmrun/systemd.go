package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The systemd mode (-systemd SCRIPT) boots the host's own systemd as PID 1
// of the guest with ctld's Debian package (`make deb`) in the share at
// $CTLD_DEB, and runs one scenario script as a oneshot service of the
// booted system; the script installs the package as a host does. The
// script's output and exit status come back like a -cmd job's.

// systemdVMTarget is the guest's boot target: only what sysinit.target pulls
// in, plus the scenario. The job timeout powers the guest off if the boot
// never reaches the scenario, so a broken boot fails fast instead of
// waiting for the run's time limit.
const systemdVMTarget = `[Unit]
Description=ctld systemd test VM
Wants=ctld-vm-scenario.service
After=ctld-vm-scenario.service
JobTimeoutSec=%d
JobTimeoutAction=poweroff-force
`

// The scenario runs in the host's namespaces with no sandboxing (it plays
// the operator), and powers the guest off when it is done. Wants= (not
// Requires=) on sysinit.target: a failed early unit is for the scenario to
// report, not a reason to never run it.
const systemdScenarioUnit = `[Unit]
Description=ctld systemd VM scenario
DefaultDependencies=no
Wants=sysinit.target
After=sysinit.target

[Service]
Type=oneshot
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/console
ExecStart=/bin/sh /ctld-vm/systemd-job.sh
`

// systemdMasked make no sense in a diskless, networkless test guest and
// only slow its boot (timers that would start apt, time sync, fstab work).
var systemdMasked = []string{
	"systemd-timesyncd.service", "systemd-pstore.service", "systemd-firstboot.service",
	"systemd-repart.service", "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount",
	"systemd-random-seed.service", "systemd-machine-id-commit.service", "systemd-remount-fs.service",
	"networking.service", "systemd-networkd-wait-online.service", "NetworkManager-wait-online.service",
	"apt-daily.service", "apt-daily-upgrade.service", "man-db.service", "e2scrub_all.service",
	"e2scrub_reap.service", "fstrim.service", "dpkg-db-backup.service", "postgresql.service",
	"getty@tty1.service", "serial-getty@ttyS0.service", "sys-kernel-debug.mount", "sys-kernel-tracing.mount",
}

// debShare is the package's path in the share; the guest sees the share
// at /ctld-vm.
const debShare = "ctld.deb"

// buildPackage runs `make deb` on the host into the share.
func buildPackage(ctx context.Context, share string) error {
	out := filepath.Join(share, debShare)
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "deb", "DEB_OUT="+out)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("make deb DEB_OUT=%s: %w", out, err)
	}
	return nil
}

// prepareSystemd writes the systemd mode's files into the share and returns
// its one job. script is relative to the working directory (the checkout,
// which the guest sees at the same path).
func prepareSystemd(ctx context.Context, c config, share, wd string, env []string) (Job, error) {
	if _, err := os.Stat(filepath.Join(wd, c.systemd)); err != nil {
		return Job{}, fmt.Errorf("systemd scenario: %w", err)
	}
	if err := buildPackage(ctx, share); err != nil {
		return Job{}, err
	}
	env = append(env, "CTLD_DEB=/ctld-vm/"+debShare)
	job := Job{Name: "systemd: " + c.systemd, Dir: wd, Argv: []string{"/bin/bash", c.systemd}, Timeout: int(c.jobTime.Seconds())}
	files := map[string]string{
		"systemd/ctld-vm.target":           fmt.Sprintf(systemdVMTarget, int(c.jobTime.Seconds())+120),
		"systemd/ctld-vm-scenario.service": systemdScenarioUnit,
		"systemd-job.sh":                   systemdJobScript(job, env),
		"guest.sh":                         systemdGuestScript(),
	}
	for name, text := range files {
		p := filepath.Join(share, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return Job{}, err
		}
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			return Job{}, err
		}
	}
	return job, nil
}

// systemdGuestScript is run as PID 1 after switch_root: it lays the
// scenario units over the writable root, gives
// ctld's state dir a filesystem that can hold overlay uppers, and execs
// systemd (which stays PID 1).
func systemdGuestScript() string {
	var b strings.Builder
	b.WriteString(`#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
install -m 0644 /ctld-vm/systemd/ctld-vm.target /ctld-vm/systemd/ctld-vm-scenario.service /etc/systemd/system/
# The build machine is a container: its marker would put systemd into
# container mode, which a sandbox host is not.
rm -f /.dockerenv /run/.containerenv
# tmpfiles runs every config as at a host's boot (ctld's included), but does
# not empty /tmp and /var/tmp: that is a walk of the build machine's whole
# /tmp over 9p, minutes under emulation.
mkdir -p /etc/systemd/system/systemd-tmpfiles-setup.service.d
cat > /etc/systemd/system/systemd-tmpfiles-setup.service.d/ctld-vm.conf <<'EOF'
[Service]
ExecStart=
ExecStart=systemd-tmpfiles --create --remove --boot --exclude-prefix=/dev --exclude-prefix=/tmp --exclude-prefix=/var/tmp
EOF
`)
	for _, u := range systemdMasked {
		fmt.Fprintf(&b, "ln -sf /dev/null /etc/systemd/system/%s\n", u)
	}
	b.WriteString(`# ctld's state dir is a real disk, XFS with project quotas, as in the
# other mode (guestScript) and on a host.
mount -t sysfs sysfs /sys
modprobe virtio_blk
modprobe xfs
mkdir -p /var/lib/ctld
if ! { [ -b /dev/vda ] && mkfs.xfs -q -f /dev/vda && mount -o prjquota /dev/vda /var/lib/ctld; }; then
	echo "vm: cannot make the state disk (/dev/vda, XFS, prjquota) for /var/lib/ctld"
	echo CTLD-INIT-FAILED
fi
echo ctld-vm > /etc/hostname
exec /lib/systemd/systemd --unit=ctld-vm.target --show-status=1
`)
	return b.String()
}

// systemdJobScript is the scenario service's program: it runs the job the
// way guestScript does, then collects dmesg and powers the guest off.
func systemdJobScript(j Job, env []string) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport HOME=/root\n")
	for _, e := range env {
		fmt.Fprintf(&b, "export %s\n", shellQuote(e))
	}
	b.WriteString("mkdir -p /ctld-vm/out\necho CTLD-GUEST-UP\n")
	fmt.Fprintf(&b, "echo '=== vm job 0: %s'\n", strings.ReplaceAll(j.Name, "'", ""))
	fmt.Fprintf(&b, "(cd %s && timeout -k 10 %d %s; echo $? > /ctld-vm/out/0.rc) 2>&1 | tee /ctld-vm/out/0.log\n",
		shellQuote(j.Dir), j.Timeout, shellJoin(j.Argv))
	b.WriteString(`dmesg -l err,crit,alert,emerg > /ctld-vm/dmesg.txt 2>&1
echo done > /ctld-vm/done
sync
echo CTLD-GUEST-DONE
systemctl poweroff --force --force
`)
	return b.String()
}
