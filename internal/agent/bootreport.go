package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/agent/wire"
)

// bootTimes are the moments of a cold agent's boot (time.Now reads no
// file, so taking them costs the readiness path nothing).
type bootTimes struct {
	main, listening, started time.Time
}

// writeBootReport leaves the boot's report in dir. The process's start comes from /proc (ticks since boot
// against the uptime), read here, after the readiness answer.
func writeBootReport(dir string, b bootTimes) {
	r := wire.BootReport{
		ListenMS: ms(b.listening.Sub(b.main)),
		StartMS:  ms(b.started.Sub(b.listening)),
	}
	if up, start, ok := procTimes(); ok {
		r.RuntimeMS = max(0, (up-start)*1000-ms(time.Since(b.main)))
	}
	writeReport(dir, wire.BootReportName, r)
}

// writeReport leaves v as JSON in dir/name (temp file and rename: the
// host never reads half of it; best effort: a diagnostic).
func writeReport(dir, name string, v any) {
	enc, err := json.Marshal(v)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if os.WriteFile(tmp, enc, 0o600) == nil {
		os.Rename(tmp, filepath.Join(dir, name))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// procTimes are the uptime and this process's start, in seconds since
// boot (USER_HZ ticks: 100 a second on Linux and gVisor).
func procTimes() (uptime, start float64, ok bool) {
	u, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, 0, false
	}
	s, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, 0, false
	}
	uf := strings.Fields(string(u))
	// The command may hold spaces: fields count from after its ")".
	i := strings.LastIndexByte(string(s), ')')
	if len(uf) == 0 || i < 0 {
		return 0, 0, false
	}
	sf := strings.Fields(string(s)[i+1:])
	// Field 22 (starttime) is the 20th after the command.
	if len(sf) < 20 {
		return 0, 0, false
	}
	up, err1 := strconv.ParseFloat(uf[0], 64)
	ticks, err2 := strconv.ParseFloat(sf[19], 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return up, ticks / 100, true
}
