// Command ctl-agent is the guest agent: the init of a ctld guest. It serves
// exec, files and the readiness answer on a Unix socket in a directory the
// host bind-mounts (runsc --host-uds=create), reaps every orphan, and runs
// the workload given after "--" as its child; it exits with the workload.
// Build it static (CGO_ENABLED=0, `make agent`): it runs in any image.
//
//	ctl-agent --socket /.ctl/agent.sock --nonce-file /.ctl/nonce [--file-cap BYTES] [-- workload args...]
//
// The workload's uid/gid come in the environment (CTL_AGENT_UID,
// CTL_AGENT_GID); the nonce in a root-only file the agent removes once
// read, never env or argv (guest users can read both in /proc).
//
// The Go runtime here does not re-read the CPU count and the container's
// cgroup limit from sysmon (first at its start, then every second), nor
// size GOMAXPROCS from the cgroup: in a gVisor guest each of those reads
// is a series of traps into the sentry, on a claim's readiness path and
// then for as long as the guest runs (the runtime's own comment names
// sandboxes as the reason for updatemaxprocs=0). GOMAXPROCS is the guest's
// CPU count; the runtime still reads the cgroup once at start (a metric).
//
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0
package main

import (
	"os"

	"github.com/ctld/ctld/internal/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:], os.Environ(), os.Stderr)) }
