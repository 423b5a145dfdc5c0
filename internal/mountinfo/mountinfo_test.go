package mountinfo

import (
	"reflect"
	"strings"
	"testing"
)

// fixture is mountinfo text in the kernel's format, shaped like the test
// VM's: a root overlay, a tmpfs, an overlay sandbox root with a mount
// inside and one stacked on it, a netns bind, an escaped path, and a
// sibling dir whose name extends the sandbox's.
const fixture = `22 1 0:20 / / rw,relatime - overlay overlay rw,lowerdir=/mnt/host,upperdir=/mnt/up/u,workdir=/mnt/up/w
23 22 0:21 / /tmp rw,nosuid,nodev shared:5 - tmpfs tmpfs rw
40 23 0:33 / /tmp/scratch/sb-1/root rw,relatime - overlay overlay rw,lowerdir=/tmp/tpl,upperdir=/tmp/scratch/sb-1/upper,workdir=/tmp/scratch/sb-1/work
41 40 0:21 /x /tmp/scratch/sb-1/root/proc rw shared:5 master:1 - tmpfs tmpfs rw
42 23 0:4 net:[4026532290] /run/netns/ctld-a rw - nsfs nsfs rw
43 23 0:21 / /tmp/with\040space rw - tmpfs tmpfs rw
44 23 0:34 / /tmp/scratch/sb-1/root rw - tmpfs tmpfs rw
45 23 0:35 / /tmp/scratch/sb-10 rw - tmpfs tmpfs rw
`

func TestParse(t *testing.T) {
	ms, err := Parse(strings.NewReader(fixture))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 8 {
		t.Fatalf("got %d mounts, want 8", len(ms))
	}
	want := Mount{
		ID: 41, ParentID: 40, Major: 0, Minor: 21, Root: "/x",
		MountPoint: "/tmp/scratch/sb-1/root/proc", Options: "rw",
		Optional: []string{"shared:5", "master:1"}, FSType: "tmpfs", Source: "tmpfs", SuperOptions: "rw",
	}
	if !reflect.DeepEqual(ms[3], want) {
		t.Errorf("line 4:\n got %+v\nwant %+v", ms[3], want)
	}
	if got := ms[5].MountPoint; got != "/tmp/with space" {
		t.Errorf("escaped mount point = %q, want %q", got, "/tmp/with space")
	}
	if got := ms[4].Root; got != "net:[4026532290]" || ms[4].FSType != "nsfs" {
		t.Errorf("nsfs line = %+v", ms[4])
	}
	if v, ok := Option(ms[2].SuperOptions, "lowerdir"); !ok || v != "/tmp/tpl" {
		t.Errorf("lowerdir = %q %v, want /tmp/tpl", v, ok)
	}
	if _, ok := Option(ms[2].SuperOptions, "nope"); ok {
		t.Error("Option found a missing key")
	}
}

func TestParseMalformed(t *testing.T) {
	for _, line := range []string{
		"22 1 0:20 / / rw",                  // too short
		"22 1 0:20 / / rw a b c d e",        // no separator
		"x 1 0:20 / / rw - tmpfs tmpfs rw",  // bad id
		"22 1 020 / / rw - tmpfs tmpfs rw",  // bad major:minor
		"22 1 0:20 / / rw shared:1 - tmpfs", // too few after separator
	} {
		if _, err := Parse(strings.NewReader(line + "\n")); err == nil {
			t.Errorf("Parse(%q) = nil error, want error", line)
		}
	}
}

func TestAtAndUnder(t *testing.T) {
	ms, err := Parse(strings.NewReader(fixture))
	if err != nil {
		t.Fatal(err)
	}
	at := At(ms, "/tmp/scratch/sb-1/root/")
	if len(at) != 2 || at[0].ID != 40 || at[1].ID != 44 {
		t.Errorf("At = %v, want ids 40, 44", ids(at))
	}
	// Deepest first, stacked (later) before the one it hides, and
	// sb-10 is not under sb-1.
	if got, want := ids(Under(ms, "/tmp/scratch/sb-1")), []int{41, 44, 40}; !reflect.DeepEqual(got, want) {
		t.Errorf("Under = %v, want %v", got, want)
	}
	if got := Under(ms, "/tmp/scratch/none"); len(got) != 0 {
		t.Errorf("Under(none) = %v, want empty", ids(got))
	}
	if got := len(Under(ms, "/")); got != len(ms) {
		t.Errorf("Under(/) has %d mounts, want %d", got, len(ms))
	}
}

func TestIsUnder(t *testing.T) {
	for _, c := range []struct {
		path, dir string
		want      bool
	}{
		{"/a/b", "/a/b", true},
		{"/a/b/c", "/a/b", true},
		{"/a/bc", "/a/b", false},
		{"/a", "/a/b", false},
		{"/a/b/", "/a/b", true},
		{"/x", "/", true},
	} {
		if got := IsUnder(c.path, c.dir); got != c.want {
			t.Errorf("IsUnder(%q, %q) = %v, want %v", c.path, c.dir, got, c.want)
		}
	}
}

func TestReadFileSelf(t *testing.T) {
	ms, err := ReadFile(SelfPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(At(ms, "/")) == 0 {
		t.Errorf("no mount at / in %s", SelfPath)
	}
}

func ids(ms []Mount) []int {
	var out []int
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}
