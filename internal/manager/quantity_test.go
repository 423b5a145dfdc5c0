package manager

import "testing"

func TestParseCPU(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"500m", 500, true},
		{"0.5", 500, true},
		{".25", 250, true},
		{"2", 2000, true},
		{"1.5", 1500, true},
		{"1m", 1, true},
		{" 250m ", 250, true},
		{"0.0005", 0, false}, // half a millicore
		{"0", 0, false},
		{"0m", 0, false},
		{"-1", 0, false},
		{"", 0, false},
		{"m", 0, false},
		{"1.5m", 0, false},
		{"1e3", 0, false},
		{"1/2", 0, false},
		{"2 cores", 0, false},
		{"99999999999999999999", 0, false},
	} {
		got, err := ParseCPU(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"256Mi", 256 << 20, true},
		{"1Gi", 1 << 30, true},
		{"1.5Gi", 3 << 29, true},
		{"512M", 512e6, true},
		{"64Ki", 64 << 10, true},
		{"2k", 2000, true},
		{"1048576", 1 << 20, true},
		{"0.5Ki", 512, true},
		{"0.3", 0, false}, // fraction of a byte
		{"0Mi", 0, false},
		{"", 0, false},
		{"Mi", 0, false},
		{"12MB", 0, false},
		{"1Xi", 0, false},
		{"-1Gi", 0, false},
		{"8Ei", 0, false}, // overflows int64
	} {
		got, err := ParseMemory(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestFormatRoundTrip(t *testing.T) {
	for _, b := range []int64{1, 1023, 1024, 256 << 20, 3 << 29, 1 << 30, 1e9} {
		got, err := ParseMemory(FormatMemory(b))
		if err != nil || got != b {
			t.Errorf("ParseMemory(FormatMemory(%d)=%q) = %d, %v", b, FormatMemory(b), got, err)
		}
	}
	for _, m := range []int64{1, 500, 1000, 2500} {
		got, err := ParseCPU(FormatCPU(m))
		if err != nil || got != m {
			t.Errorf("ParseCPU(FormatCPU(%d)=%q) = %d, %v", m, FormatCPU(m), got, err)
		}
	}
	if FormatMemory(256<<20) != "256Mi" || FormatCPU(500) != "500m" || FormatCPU(2000) != "2" {
		t.Errorf("format: %s %s %s", FormatMemory(256<<20), FormatCPU(500), FormatCPU(2000))
	}
}
