package netpolicy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestPathDefaults(t *testing.T) {
	if got := (&Netns{}).Path("sb-1"); got != "/run/netns/ctld-sb-1" {
		t.Errorf("default Path = %q", got)
	}
	if got := (&Netns{Dir: "/tmp/ns/", Prefix: "t-"}).Path("sb-1"); got != "/tmp/ns/t-sb-1" {
		t.Errorf("Path = %q", got)
	}
}

// Bad names are refused before anything is touched: the dir is not even
// created.
func TestRejectsBadNames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "netns")
	n := &Netns{Dir: dir}
	ctx := context.Background()
	for _, name := range []string{"", "..", "../x", "a/b", "UPPER", "x_y", strings.Repeat("a", 64), "-a"} {
		if _, err := n.Create(ctx, name); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("Create(%q) = %v, want invalid_argument", name, err)
		}
		if err := n.Delete(ctx, name); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("Delete(%q) = %v, want invalid_argument", name, err)
		}
		if _, _, err := n.Describe(ctx, name); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("Describe(%q) = %v, want invalid_argument", name, err)
		}
		if ok, _ := n.CheckGone(ctx, name, NSID{}); ok {
			t.Errorf("CheckGone(%q) = true for an invalid name", name)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("netns dir created for bad names: %v", err)
	}
}

func TestListAndCheckGone(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"ctld-b", "ctld-a", "other", "ctld-Bad_Name"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mi, []byte(
		"1 0 0:1 / / rw - rootfs rootfs rw\n"+
			"42 1 0:4 net:[4026532290] "+dir+"/ctld-m rw - nsfs nsfs rw\n"+
			"43 1 0:4 net:[4026532291] "+dir+"-other/ctld-o rw - nsfs nsfs rw\n"+
			"44 1 0:5 / "+dir+"/ctld-t rw - tmpfs tmpfs rw\n"+
			"45 1 0:4 net:[4026532292] "+dir+"/other rw - nsfs nsfs rw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := &Netns{Dir: dir, MountinfoPath: mi}
	ctx := context.Background()
	names, err := n.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !reflect.DeepEqual(names, want) {
		t.Errorf("List = %v, want %v", names, want)
	}
	// Mounted: only an nsfs mount of a prefixed name in Dir counts.
	if names, err := n.Mounted(ctx); err != nil || !reflect.DeepEqual(names, []string{"m"}) {
		t.Errorf("Mounted = %v, %v; want [m]", names, err)
	}
	for _, c := range []struct {
		name   string
		ok     bool
		detail string
	}{
		{"a", false, "still exists"},
		{"m", false, "still mounted"},
		{"z", true, "absent and not mounted"},
	} {
		ok, detail := n.CheckGone(ctx, c.name, NSID{})
		if ok != c.ok || !strings.Contains(detail, c.detail) {
			t.Errorf("CheckGone(%q) = %v, %q; want %v, ~%q", c.name, ok, detail, c.ok, c.detail)
		}
	}
	// Delete of a plain (unmounted) file removes it, twice is fine.
	for i := 0; i < 2; i++ {
		if err := n.Delete(ctx, "a"); err != nil && os.Geteuid() == 0 {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if os.Geteuid() == 0 {
		if ok, detail := n.CheckGone(ctx, "a", NSID{}); !ok {
			t.Errorf("after Delete: %s", detail)
		}
	}
	if names, err := (&Netns{Dir: filepath.Join(dir, "missing")}).List(ctx); err != nil || len(names) != 0 {
		t.Errorf("List of a missing dir = %v, %v; want empty, nil", names, err)
	}
}

func TestFormatRoute(t *testing.T) {
	links := map[int]string{1: "lo", 2: "eth0"}
	_, dst, _ := net.ParseCIDR("127.0.0.0/8")
	for _, c := range []struct {
		r    netlink.Route
		want string
	}{
		{netlink.Route{Table: unix.RT_TABLE_LOCAL, Dst: dst, LinkIndex: 1}, "local 127.0.0.0/8 dev lo"},
		{netlink.Route{Table: unix.RT_TABLE_MAIN, LinkIndex: 2, Gw: net.ParseIP("10.0.0.1")}, "main default dev eth0 via 10.0.0.1"},
		{netlink.Route{Table: 100, Dst: dst, LinkIndex: 9}, "100 127.0.0.0/8 dev if9"},
	} {
		if got := formatRoute(c.r, links); got != c.want {
			t.Errorf("formatRoute = %q, want %q", got, c.want)
		}
	}
}
