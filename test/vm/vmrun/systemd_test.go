package main

import (
	"strings"
	"testing"
)

func TestSystemdGuestExecsSystemd(t *testing.T) {
	s := systemdGuestScript()
	for _, want := range []string{
		"ln -sf /dev/null /etc/systemd/system/systemd-timesyncd.service",
		"mount -o prjquota /dev/vda /var/lib/ctld",
		"exec /lib/systemd/systemd --unit=ctld-vm.target",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("guest script lacks %q", want)
		}
	}
	// systemd must be the last thing: it has to stay PID 1.
	if !strings.HasSuffix(strings.TrimSpace(s), "--show-status=1") {
		t.Errorf("guest script does not end by exec'ing systemd:\n%s", s)
	}
}

func TestSystemdJobReportsLikeAJobAndPowersOff(t *testing.T) {
	s := systemdJobScript(Job{Name: "systemd: s.sh", Dir: "/r", Argv: []string{"/bin/bash", "s.sh"}, Timeout: 60}, []string{"K=v"})
	for _, want := range []string{
		"export 'K=v'",
		"echo CTLD-GUEST-UP",
		"cd '/r' && timeout -k 10 60 '/bin/bash' 's.sh'; echo $? > /ctld-vm/out/0.rc",
		"echo done > /ctld-vm/done",
		"systemctl poweroff --force --force",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("job script lacks %q", want)
		}
	}
}
