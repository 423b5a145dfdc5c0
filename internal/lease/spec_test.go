package lease

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func good() Spec {
	return Spec{ID: "sbx-1", CPUMillis: 1000, MemoryBytes: 256 << 20, PIDs: 128}
}

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Spec)
		ok   bool
	}{
		{"good", func(s *Spec) {}, true},
		{"one char id", func(s *Spec) { s.ID = "a" }, true},
		{"63 char id", func(s *Spec) { s.ID = strings.Repeat("a", 63) }, true},
		{"digit first", func(s *Spec) { s.ID = "0abc-def" }, true},
		{"cpuset", func(s *Spec) { s.Cpuset = "0-1,3" }, true},
		{"min limits", func(s *Spec) { s.CPUMillis, s.MemoryBytes, s.PIDs = MinCPUMillis, MinMemoryBytes, 1 }, true},
		{"empty id", func(s *Spec) { s.ID = "" }, false},
		{"64 char id", func(s *Spec) { s.ID = strings.Repeat("a", 64) }, false},
		{"300 char id", func(s *Spec) { s.ID = strings.Repeat("a", 300) }, false},
		{"dotdot", func(s *Spec) { s.ID = ".." }, false},
		{"dotdot slash", func(s *Spec) { s.ID = "../x" }, false},
		{"slash", func(s *Spec) { s.ID = "a/b" }, false},
		{"NUL", func(s *Spec) { s.ID = "a\x00b" }, false},
		{"unicode", func(s *Spec) { s.ID = "sandbox-é" }, false},
		{"uppercase", func(s *Spec) { s.ID = "Sbx" }, false},
		{"leading dash", func(s *Spec) { s.ID = "-x" }, false},
		{"dot", func(s *Spec) { s.ID = "a.b" }, false},
		{"newline", func(s *Spec) { s.ID = "a\n" }, false},
		{"space", func(s *Spec) { s.ID = "a b" }, false},
		{"zero cpu", func(s *Spec) { s.CPUMillis = 0 }, false},
		{"negative cpu", func(s *Spec) { s.CPUMillis = -1000 }, false},
		{"cpu below kernel quota min", func(s *Spec) { s.CPUMillis = MinCPUMillis - 1 }, false},
		{"cpu too large", func(s *Spec) { s.CPUMillis = MaxCPUMillis + 1 }, false},
		{"zero memory", func(s *Spec) { s.MemoryBytes = 0 }, false},
		{"negative memory", func(s *Spec) { s.MemoryBytes = -1 }, false},
		{"tiny memory", func(s *Spec) { s.MemoryBytes = 4096 }, false},
		{"memory above the limit", func(s *Spec) { s.MemoryBytes = MaxMemoryBytes + 1 }, false},
		{"trailing dash", func(s *Spec) { s.ID = "sb-" }, false},
		{"cpuset too long", func(s *Spec) { s.Cpuset = strings.Repeat("1,", MaxCpusetLen) + "1" }, false},
		{"zero pids", func(s *Spec) { s.PIDs = 0 }, false},
		{"negative pids", func(s *Spec) { s.PIDs = -5 }, false},
		{"pids above kernel max", func(s *Spec) { s.PIDs = MaxPIDs + 1 }, false},
		{"cpuset letters", func(s *Spec) { s.Cpuset = "a" }, false},
		{"cpuset backwards", func(s *Spec) { s.Cpuset = "3-1" }, false},
		{"cpuset trailing comma", func(s *Spec) { s.Cpuset = "0," }, false},
		{"cpuset sign", func(s *Spec) { s.Cpuset = "+1" }, false},
		{"cpuset huge", func(s *Spec) { s.Cpuset = "0-99999999" }, false},
		{"cpuset newline", func(s *Spec) { s.Cpuset = "0\n1" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good()
			tt.edit(&s)
			err := s.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate(%+v) = %v, want nil", s, err)
			}
			if !tt.ok && !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate(%+v) = %v, want ErrInvalid", s, err)
			}
		})
	}
}

func TestSpecValidateReportsEveryProblem(t *testing.T) {
	err := Spec{ID: "../x", CPUMillis: 0, MemoryBytes: -1, PIDs: 0}.Validate()
	for _, want := range []string{"id", "cpu_millis", "memory_bytes", "pids"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %s", err, want)
		}
	}
}

func TestSpecFiles(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want map[string]string
	}{
		{
			name: "one cpu",
			spec: Spec{ID: "a", CPUMillis: 1000, MemoryBytes: 512 << 20, PIDs: 64},
			want: map[string]string{
				"cpu.max": "100000 100000", "cpu.weight": "100", "memory.max": "536870912",
				"memory.swap.max": "0", "pids.max": "64",
			},
		},
		{
			name: "quarter cpu with cpuset",
			spec: Spec{ID: "a", CPUMillis: 250, MemoryBytes: 1 << 20, PIDs: 1, Cpuset: "0,2-3"},
			want: map[string]string{
				"cpu.max": "25000 100000", "cpu.weight": "25", "memory.max": "1048576",
				"memory.swap.max": "0", "pids.max": "1", "cpuset.cpus": "0,2-3",
			},
		},
		{
			name: "smallest cpu clamps weight to 1",
			spec: Spec{ID: "a", CPUMillis: 10, MemoryBytes: 1 << 30, PIDs: 10},
			want: map[string]string{
				"cpu.max": "1000 100000", "cpu.weight": "1", "memory.max": "1073741824",
				"memory.swap.max": "0", "pids.max": "10",
			},
		},
		{
			name: "many cpus clamp weight to 10000",
			spec: Spec{ID: "a", CPUMillis: 200000, MemoryBytes: 1 << 30, PIDs: 10},
			want: map[string]string{
				"cpu.max": "20000000 100000", "cpu.weight": "10000", "memory.max": "1073741824",
				"memory.swap.max": "0", "pids.max": "10",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.spec.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := tt.spec.Files(); !maps.Equal(got, tt.want) {
				t.Fatalf("Files() = %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestWeight(t *testing.T) {
	for millis, want := range map[int64]int64{1: 1, 10: 1, 19: 1, 20: 2, 1000: 100, 2500: 250, 100000: 10000, 1 << 40: 10000} {
		if got := Weight(millis); got != want {
			t.Errorf("Weight(%d) = %d, want %d", millis, got, want)
		}
	}
}

func TestSortedFilesPutsCpusetFirst(t *testing.T) {
	s := good()
	s.Cpuset = "0"
	got := sortedFiles(s.Files())
	want := []string{"cpuset.cpus", "cpu.max", "cpu.weight", "memory.max", "memory.swap.max", "pids.max"}
	if !slices.Equal(got, want) {
		t.Fatalf("sortedFiles = %v, want %v", got, want)
	}
}

func TestSameValue(t *testing.T) {
	tests := []struct {
		name, file, want, got string
		same                  bool
	}{
		{"exact", "pids.max", "64", "64\n", true},
		{"differs", "pids.max", "64", "max\n", false},
		{"cpu.max", "cpu.max", "25000 100000", "25000 100000\n", true},
		{"cpu.max differs", "cpu.max", "25000 100000", "max 100000\n", false},
		{"memory rounded to page", "memory.max", "1048577", "1048576\n", true},
		{"memory aligned", "memory.max", "1048576", "1048576\n", true},
		{"memory lower than rounding", "memory.max", "1048576", "1044480\n", false},
		{"memory max literal", "memory.max", "max", "max\n", true},
		{"swap zero", "memory.swap.max", "0", "0\n", true},
		{"swap not applied", "memory.swap.max", "0", "max\n", false},
		{"cpuset normalised", "cpuset.cpus", "0,1,2,5", "0-2,5\n", true},
		{"cpuset differs", "cpuset.cpus", "0-1", "0\n", false},
		{"cpuset empty read", "cpuset.cpus", "0", "\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameValue(tt.file, tt.want, tt.got, 4096); got != tt.same {
				t.Fatalf("sameValue(%s, %q, %q) = %t, want %t", tt.file, tt.want, tt.got, got, tt.same)
			}
		})
	}
}

func TestParseCPUList(t *testing.T) {
	got, err := ParseCPUList("5,0-2,1")
	if err != nil || !slices.Equal(got, []int{0, 1, 2, 5}) {
		t.Fatalf("ParseCPUList = %v, %v", got, err)
	}
	for _, bad := range []string{"", ",", "1-", "-1", "a", "1 2", "2-1", "8192"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q) accepted", bad)
		}
	}
}

func TestParseKV(t *testing.T) {
	kv, err := parseKV("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
	if err != nil || kv["oom_kill"] != 1 || kv["max"] != 3 || len(kv) != 6 {
		t.Fatalf("parseKV = %v, %v", kv, err)
	}
	if _, err := parseKV("populated"); err == nil {
		t.Fatal("parseKV accepted a line without a value")
	}
}

func TestValidParent(t *testing.T) {
	for _, p := range []string{"ctld.slice", "system.slice/ctld.slice", "ctld-test-0a1b.slice"} {
		if err := validParent(p); err != nil {
			t.Errorf("validParent(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "/ctld.slice", "..", "a/../b", "a//b", "a/", ".", "./a", "a\x00"} {
		if err := validParent(p); err == nil {
			t.Errorf("validParent(%q) accepted", p)
		}
	}
}

func TestPaths(t *testing.T) {
	m := &Manager{}
	if got := m.Dir("sbx-1"); got != "/sys/fs/cgroup/ctld.slice/sbx-1" {
		t.Errorf("Dir = %q", got)
	}
	if got := m.CgroupsPath("sbx-1"); got != "/ctld.slice/sbx-1" {
		t.Errorf("CgroupsPath = %q", got)
	}
	for _, bad := range []string{"../x", "a/b", ""} {
		if m.Dir(bad) != "" || m.CgroupsPath(bad) != "" {
			t.Errorf("Dir/CgroupsPath built a path from invalid id %q", bad)
		}
	}
	m = &Manager{Root: "/r", Parent: "p.slice/q.slice"}
	if got := m.Dir("x"); got != "/r/p.slice/q.slice/x" {
		t.Errorf("Dir = %q", got)
	}
	if got := m.CgroupsPath("x"); got != "/p.slice/q.slice/x" {
		t.Errorf("CgroupsPath = %q", got)
	}
}

// TestRootFSConfined checks the confinement itself (plain filesystem
// semantics, not cgroupfs): a symlink or ".." cannot lead a write outside
// the root, and a failed write names the path and value.
func TestRootFSConfined(t *testing.T) {
	outside := t.TempDir()
	root := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := openRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, rel := range []string{"link/f", "../" + filepath.Base(outside) + "/f", outside + "/f"} {
		err := r.write(rel, "x")
		var we *WriteError
		if !errors.As(err, &we) {
			t.Fatalf("write(%q) = %v, want a WriteError", rel, err)
		}
		if we.Value != "x" || !strings.Contains(err.Error(), rel) {
			t.Errorf("write error %q lacks path or value", err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "f")); len(b) != 0 {
		t.Fatalf("write escaped the root: outside file has %q", b)
	}
	if err := r.mkdir("link/d"); err == nil {
		t.Fatal("mkdir through a symlink succeeded")
	}
	if err := r.mkdir("d"); err != nil {
		t.Fatalf("mkdir inside root: %v", err)
	}
	if err := r.write("d/f", "v"); err == nil {
		// Plain directories have no file f and O_CREAT is never used.
		t.Fatal("write created a file; cgroup writes must never create files")
	}
	if err := r.rmdir("d"); err != nil {
		t.Fatalf("rmdir inside root: %v", err)
	}
	if _, err := openRoot("relative"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("openRoot(relative) = %v, want ErrInvalid", err)
	}
}
