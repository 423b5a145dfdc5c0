package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/spf13/pflag"
)

func TestFlagsLevelAndFormat(t *testing.T) {
	var f Flags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f.Register(fs)
	if err := fs.Parse([]string{"--log-level", "warn", "--log-format", "json"}); err != nil {
		t.Fatal(err)
	}
	o, err := f.Options(false)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	l := NewWith(&b, o).With("slot", "a")
	l.Info("hidden")
	l.Warn("shown", "n", 1)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["level"] != "WARN" || rec["msg"] != "shown" || rec["slot"] != "a" {
		t.Fatalf("json line %q: %v", b.String(), err)
	}
	for _, bad := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}} {
		var f Flags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f.Register(fs)
		fs.Parse(bad)
		if _, err := f.Options(false); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: got %v", bad, err)
		}
	}
	o, _ = (&Flags{Level: "debug", Format: "text"}).Options(false)
	b.Reset()
	NewWith(&b, o).Debug("visible")
	if !strings.Contains(b.String(), "level=DEBUG msg=visible") {
		t.Fatalf("debug line: %q", b.String())
	}
}

func TestJournaldPriorities(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		l := NewWith(&b, Options{Level: slog.LevelDebug, Format: format, Journald: true}).With("slot", "b").WithGroup("g")
		l.Debug("d", "k", 1)
		l.Info("i")
		l.Warn("w")
		l.Error("e")
		lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
		if len(lines) != 4 {
			t.Fatalf("%s: lines %q", format, lines)
		}
		for i, p := range []string{"<7>", "<6>", "<4>", "<3>"} {
			if !strings.HasPrefix(lines[i], p) || !strings.Contains(lines[i], "slot") {
				t.Errorf("%s: line %d = %q, want prefix %s and the logger's attrs", format, i, lines[i], p)
			}
		}
		if format == "text" && !strings.Contains(lines[0], "slot=b g.k=1") {
			t.Errorf("group lost: %q", lines[0])
		}
	}
}

func TestUnderJournald(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	match := strconv.FormatUint(uint64(st.Dev), 10) + ":" + strconv.FormatUint(st.Ino, 10)
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "JOURNAL_STREAM" {
				return v
			}
			return ""
		}
	}
	if !UnderJournald(env(match), f) {
		t.Fatal("matching JOURNAL_STREAM not seen")
	}
	// A stderr the unit redirected elsewhere keeps the variable but not
	// the stream.
	if UnderJournald(env("1:2"), f) || UnderJournald(env(""), f) || UnderJournald(env(match), nil) {
		t.Fatal("journald assumed without its stream")
	}
}
