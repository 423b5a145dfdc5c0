package agent

import (
	"context"
	"path"
	"regexp"
	"strings"

	"github.com/ctld/ctld/internal/agent/wire"
)

// A warm agent (issue 27) is a pool member's init: runsc booted it ahead
// with no workload and the member's own nonce (the member's readiness
// proof). A claim that takes the member sends one OpClaim with the
// claim's nonce, user, args, env and cwd: the agent starts the workload
// and from then on answers OpReady with the claim's nonce and runs calls
// that name no user as the claim's user. Nothing else of the boot reaches
// the workload: its environment is the claim's alone (the agent's own
// settings were taken out at boot), its working directory the claim's.

// Claim is a warm agent's one claim.
type Claim struct {
	Nonce     string
	User      wire.User
	Args, Env []string
	Cwd       string
	// Hostname is the guest's hostname from the claim on ("": the
	// boot's); only an agent started with --hostname-cap sets one.
	Hostname string
}

// MaxClaimArgs bounds a claim's args and env entries (each; the frame
// bounds their bytes).
const MaxClaimArgs = 4096

var hostnamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,63}$`)

// claimOf checks req as a claim: a nonce the host's client accepts back,
// a command, an absolute cwd, no agent setting in env.
func claimOf(req wire.Request, u wire.User) (Claim, string) {
	c := Claim{Nonce: req.Nonce, User: u, Args: req.Args, Env: req.Env, Cwd: req.Cwd, Hostname: req.Hostname}
	switch {
	case len(c.Nonce) == 0 || len(c.Nonce) > 256:
		return c, "claim nonce must be 1 to 256 bytes"
	case len(c.Args) == 0 || c.Args[0] == "":
		return c, "claim without a command"
	case len(c.Args) > MaxClaimArgs || len(c.Env) > MaxClaimArgs:
		return c, "claim args or env: more than 4096 entries"
	case c.Cwd != "" && !path.IsAbs(c.Cwd):
		return c, "claim cwd must be absolute"
	case c.Hostname != "" && !hostnamePattern.MatchString(c.Hostname):
		return c, "claim hostname must be 1 to 64 letters, digits, dots and dashes, not starting with one"
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e, envPrefix) {
			return c, "claim env: " + envPrefix + "* is reserved for the agent"
		}
	}
	if !hasPath(c.Env) {
		// As runsc.BuildSpec gives a cold generation's process.
		c.Env = append([]string{"PATH=" + DefaultPath}, c.Env...)
	}
	return c, ""
}

func hasPath(env []string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return true
		}
	}
	return false
}

// identity is the nonce and default user calls are answered with: the
// claim's once one was taken, the boot's before.
func (s *Server) identity() (string, wire.User) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claim != nil {
		return s.claim.Nonce, s.claim.User
	}
	return s.Nonce, s.User
}

// handleClaim serves OpClaim: once per agent, only on a warm one.
func (s *Server) handleClaim(ctx context.Context, c *conn, req wire.Request) {
	if s.Claim == nil {
		c.fail(wire.CodeInvalid, "not a warm agent: its workload started at boot")
		return
	}
	u := wire.User{}
	if req.User != nil {
		u = *req.User
	}
	cl, bad := claimOf(req, u)
	if bad == "" && cl.Hostname != "" && !s.Hostnames {
		bad = "this agent cannot set a hostname (no --hostname-cap)"
	}
	if bad != "" {
		c.fail(wire.CodeInvalid, "%s", bad)
		return
	}
	s.mu.Lock()
	taken := s.claimTaken
	s.claimTaken = true
	s.mu.Unlock()
	if taken {
		// Single use: a member serves one claim, whether it started or not.
		c.fail(wire.CodeExists, "this warm agent was claimed already")
		return
	}
	if err := s.Claim(ctx, cl); err != nil {
		c.fail(wire.CodeNotStarted, "the workload did not start: %v", err)
		return
	}
	s.mu.Lock()
	s.claim = &cl
	s.mu.Unlock()
	c.json(wire.TResult, wire.Ready{Nonce: cl.Nonce})
}
