package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/runsc"
)

// check is one host requirement: ok, what was seen, and how to fix it.
type check struct {
	name   string
	ok     bool
	detail string
	fix    string
}

func doctorCmd(g *globalOpts) *cobra.Command {
	var cgroupRoot, runscBin, platform string
	c := &cobra.Command{
		Use:   "doctor",
		Short: "check that this host can run ctld (cgroup v2, nbd, nf_tables, runsc, mkfs tools)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
			defer cancel()
			failed := 0
			checks := doctorChecks(ctx, cgroupRoot)
			checks = append(checks, runscChecks(ctx, runscBin, platform)...)
			for _, c := range append(checks, stateChecks(g.stateDir)...) {
				mark := "ok  "
				if !c.ok {
					mark = "FAIL"
					failed++
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %-22s %s\n", mark, c.name, c.detail)
				if !c.ok && c.fix != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "     fix: %s\n", c.fix)
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d check(s) failed", failed)
			}
			return nil
		},
	}
	c.Flags().StringVar(&cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup v2 mount point")
	runscFlags(c.Flags(), &runscBin, &platform)
	return c
}

func doctorChecks(ctx context.Context, cgroupRoot string) []check {
	var out []check
	out = append(out, check{name: "root", ok: os.Geteuid() == 0, detail: fmt.Sprintf("euid %d", os.Geteuid()), fix: "run ctld as root (systemd ctld@.service does)"})

	ctrl, err := os.ReadFile(cgroupRoot + "/cgroup.controllers")
	c := check{name: "cgroup v2", fix: "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2 only) so cpu, memory, pids, cpuset, io are v2 controllers"}
	if err != nil {
		c.detail = fmt.Sprintf("no cgroup2 at %s: %v", cgroupRoot, err)
	} else {
		have := strings.Fields(string(ctrl))
		var missing []string
		for _, want := range []string{"cpu", "memory", "pids", "cpuset", "io"} {
			if !contains(have, want) {
				missing = append(missing, want)
			}
		}
		c.ok = len(missing) == 0
		c.detail = "controllers: " + strings.Join(have, " ")
		if !c.ok {
			c.detail += "; missing: " + strings.Join(missing, " ")
		}
	}
	out = append(out, c)

	_, err = os.Stat("/sys/block/nbd0")
	out = append(out, check{name: "nbd", ok: err == nil, detail: statDetail("/sys/block/nbd0", err), fix: "modprobe nbd nbds_max=64 (systemd/modules-load.d/ctld.conf)"})

	c = check{name: "nf_tables", fix: "modprobe nf_tables; apt-get install nftables"}
	if conn, err := nftables.New(); err != nil {
		c.detail = err.Error()
	} else if _, err := conn.ListTables(); err != nil {
		c.detail = "list tables: " + err.Error()
	} else {
		c.ok, c.detail = true, "netlink ok"
	}
	out = append(out, c)

	for _, bin := range []struct{ name, pkg string }{{"mkfs.ext4", "e2fsprogs"}, {"mkfs.xfs", "xfsprogs"}, {"ip", "iproute2"}} {
		p, err := exec.LookPath(bin.name)
		c := check{name: bin.name, ok: err == nil, fix: "apt-get install " + bin.pkg}
		if err != nil {
			c.detail = err.Error()
		} else {
			c.detail = p
		}
		out = append(out, c)
	}
	if _, err := os.Stat("/proc/1/ns/net"); err != nil {
		out = append(out, check{name: "pid 1 namespaces", detail: err.Error(), fix: "runsc needs /proc/1/ns visible to run a sandbox network namespace"})
	} else {
		out = append(out, check{name: "pid 1 namespaces", ok: true, detail: "/proc/1/ns/net visible"})
	}
	_ = ctx
	return out
}

// runscChecks: the runsc binary ctld runs, its build (`runsc --version`)
// and the platform it will use, which the binary must offer.
func runscChecks(ctx context.Context, binary, platform string) []check {
	const fix = "apt-get install runsc, or set runsc = PATH to a current gVisor build (docs/operations.md, \"runsc\")"
	p, err := exec.LookPath(binary)
	if err != nil {
		return []check{{name: "runsc", detail: err.Error(), fix: fix}}
	}
	v, err := runsc.Version(ctx, p)
	if err != nil {
		return []check{{name: "runsc", detail: err.Error(), fix: fix}}
	}
	out := []check{{name: "runsc", ok: true, detail: fmt.Sprintf("%s: version %s", p, v)}}
	c := check{name: "runsc platform", fix: "set runsc-platform to one the build offers, or leave it empty for its default"}
	def, all, err := runsc.Platforms(ctx, p)
	switch {
	case err != nil:
		c.detail = err.Error()
	case platform == "":
		c.ok, c.detail = true, fmt.Sprintf("%s (the build's default; it offers %s)", def, strings.Join(all, ", "))
	default:
		c.ok = slices.Contains(all, platform)
		c.detail = fmt.Sprintf("%s (set; the build offers %s)", platform, strings.Join(all, ", "))
	}
	return append(out, c)
}

func statDetail(p string, err error) string {
	if err != nil {
		return err.Error()
	}
	return p + " present"
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
