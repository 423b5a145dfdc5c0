package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/service"
	"github.com/ctld/ctld/internal/snippet"
)

// The service: `serve` runs the HTTP API; `key` and `owner` manage who
// may call it and how much they may hold.

func (c *cli) serviceCommands() []*cobra.Command {
	return []*cobra.Command{c.serveCommand(), c.keyCommand(), c.ownerCommand()}
}

// openStore opens --db: a SQLite file, or PostgreSQL for a postgres:// URL.
func (c *cli) openStore(ctx context.Context) (*manager.Store, error) {
	return manager.Open(ctx, c.db, nil)
}

// storeAction runs fn with the manager's database open.
func (c *cli) storeAction(what func([]string) string, fn func(ctx context.Context, st *manager.Store, args []string) error) func(*cobra.Command, []string) error {
	return c.action(what, func(ctx context.Context, args []string) error {
		st, err := c.openStore(ctx)
		if err != nil {
			return err
		}
		defer st.Close()
		return fn(ctx, st, args)
	})
}

func (c *cli) keyCommand() *cobra.Command {
	g := group("key", "Create, list and revoke API keys of the service")
	var owner string
	create := &cobra.Command{Use: "create --owner TEAM", Short: "Create an API key for an owner (printed once; only its hash is kept)", Args: noArgs}
	create.Flags().StringVar(&owner, "owner", "", "the owner (team) the key acts for; created if new")
	create.RunE = c.storeAction(fixed("key create"), func(ctx context.Context, st *manager.Store, _ []string) error {
		if owner == "" {
			return usageError{errors.New("key create needs --owner TEAM")}
		}
		if _, err := st.CreateOwner(ctx, owner); err != nil {
			return err
		}
		key, rec, err := st.CreateKey(ctx, owner)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(struct {
				Key string `json:"key"`
				manager.KeyRecord
			}{key, rec})
		}
		fmt.Fprintln(c.stdout, key)
		fmt.Fprintf(c.stderr, "key %s for owner %s: shown once, only its hash is stored\n", rec.KeyID, owner)
		return nil
	})
	var lsOwner string
	ls := &cobra.Command{Use: "ls [--owner TEAM]", Short: "List API keys (ids, never the keys)", Args: noArgs}
	ls.Flags().StringVar(&lsOwner, "owner", "", "only this owner's keys")
	ls.RunE = c.storeAction(fixed("key ls"), func(ctx context.Context, st *manager.Store, _ []string) error {
		keys, err := st.Keys(ctx, lsOwner)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(keys)
		}
		w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "KEY ID\tOWNER\tCREATED\tREVOKED")
		for _, k := range keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", k.KeyID, k.Owner, k.CreatedAt.Format(time.RFC3339), revoked)
		}
		return w.Flush()
	})
	revoke := &cobra.Command{Use: "revoke KEY-ID", Short: "Revoke an API key (by the id `key ls` shows)", Args: exactArgs(1, "KEY-ID")}
	revoke.RunE = c.storeAction(named("key revoke"), func(ctx context.Context, st *manager.Store, args []string) error {
		if err := st.RevokeKey(ctx, args[0]); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "key %s revoked\n", args[0])
		return nil
	})
	g.AddCommand(create, ls, revoke)
	return g
}

func (c *cli) ownerCommand() *cobra.Command {
	g := group("owner", "Show and set owners' quotas")
	quota := group("quota", "Show or set an owner's quota")
	var sandboxes, rate int64
	var cpu, memory, disk string
	set := &cobra.Command{Use: "set TEAM [--sandboxes N] [--cpu 4] [--memory 8Gi] [--disk 50Gi] [--creates-per-min N]", Short: "Set an owner's quota (unset flags keep their value)", Args: exactArgs(1, "TEAM")}
	f := set.Flags()
	f.Int64Var(&sandboxes, "sandboxes", -1, "sandboxes held at once")
	f.StringVar(&cpu, "cpu", "", "total CPU of its sandboxes: cores (4) or millicores (4000m)")
	f.StringVar(&memory, "memory", "", "total memory of its sandboxes (8Gi)")
	f.StringVar(&disk, "disk", "", "total disk of its sandboxes (50Gi)")
	f.Int64Var(&rate, "creates-per-min", -1, "creates per minute")
	set.RunE = c.storeAction(named("owner quota set"), func(ctx context.Context, st *manager.Store, args []string) error {
		if _, err := st.CreateOwner(ctx, args[0]); err != nil {
			return err
		}
		o, err := st.Owner(ctx, args[0])
		if err != nil {
			return err
		}
		q := o.Quota
		if sandboxes >= 0 {
			q.Sandboxes = sandboxes
		}
		if rate >= 0 {
			q.CreatesPerMin = rate
		}
		for _, p := range []struct {
			flag, v string
			parse   func(string) (int64, error)
			dst     *int64
		}{{"--cpu", cpu, manager.ParseCPU, &q.CPUMillis}, {"--memory", memory, manager.ParseMemory, &q.MemoryBytes}, {"--disk", disk, manager.ParseMemory, &q.DiskBytes}} {
			if p.v == "" {
				continue
			}
			n, err := p.parse(p.v)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", p.flag, err)}
			}
			*p.dst = n
		}
		if o, err = st.SetQuota(ctx, args[0], q); err != nil {
			return err
		}
		return c.printQuota(ctx, st, o)
	})
	get := &cobra.Command{Use: "get TEAM", Short: "Show an owner's quota and usage", Args: exactArgs(1, "TEAM")}
	get.RunE = c.storeAction(named("owner quota get"), func(ctx context.Context, st *manager.Store, args []string) error {
		o, err := st.Owner(ctx, args[0])
		if err != nil {
			return err
		}
		return c.printQuota(ctx, st, o)
	})
	quota.AddCommand(set, get)
	g.AddCommand(quota)
	return g
}

func (c *cli) printQuota(ctx context.Context, st *manager.Store, o manager.Owner) error {
	u, err := st.Usage(ctx, o.Name)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(struct {
			manager.Owner
			Usage manager.Usage `json:"usage"`
		}{o, u})
	}
	q := o.Quota
	fmt.Fprintf(c.stdout, "owner %s: sandboxes %d/%d, cpu %s/%s, memory %s/%s, disk %s/%s, creates per minute %d\n", o.Name,
		u.Sandboxes, q.Sandboxes, manager.FormatCPU(u.CPUMillis), manager.FormatCPU(q.CPUMillis),
		manager.FormatMemory(u.MemoryBytes), manager.FormatMemory(q.MemoryBytes), manager.FormatMemory(u.DiskBytes), manager.FormatMemory(q.DiskBytes), q.CreatesPerMin)
	return nil
}

// parseTemplates reads --template NAME[:MODE[:LANG,...]] values: the
// languages are what the code call runs in the template's sandboxes.
func parseTemplates(vals []string) ([]client.Template, error) {
	var out []client.Template
	for _, v := range vals {
		name, rest, _ := strings.Cut(v, ":")
		mode, langs, _ := strings.Cut(rest, ":")
		if mode == "" {
			mode = string(api.RootFSOverlay)
		}
		if name == "" || (mode != string(api.RootFSOverlay) && mode != string(api.RootFSBlock)) {
			return nil, usageError{fmt.Errorf("--template %q: want NAME or NAME:overlay or NAME:block, then optionally :LANG,LANG", v)}
		}
		t := client.Template{Name: name, Mode: mode}
		for _, l := range strings.Split(langs, ",") {
			if l == "" {
				continue
			}
			if _, err := snippet.Lookup(l); err != nil {
				return nil, usageError{fmt.Errorf("--template %q: %w", v, err)}
			}
			t.Languages = append(t.Languages, l)
		}
		out = append(out, t)
	}
	return out, nil
}

func (c *cli) serveCommand() *cobra.Command {
	var listen, cert, key string
	var templates []string
	var allowPlain bool
	var defTimeout, maxTimeout, createTimeout time.Duration
	var maxFile, volumeTmp string
	var replicaID string
	var leaseTTL, usagePull time.Duration
	var inFleet bool
	var chf channelFlags
	cmd := &cobra.Command{Use: "serve [--listen 127.0.0.1:8080] [--tls-cert FILE --tls-key FILE]", Short: "Serve the sandbox API (HTTP/1.1 + JSON, API keys, quotas, lifetimes)", Args: noArgs}
	f := cmd.Flags()
	// Volumes live in ctld's block store: its settings come from ctld's
	// configuration file (flags still win), like the volume commands'.
	tf := &templateFlags{getenv: c.getenv, compress: blockstore.CompressS2}
	tf.register(f, "ctld creates it")
	f.StringVar(&volumeTmp, "volume-tmp-dir", os.TempDir(), "directory for a volume's image while it is built")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error { return c.applyStoreConfig(cmd.Flags()) }
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on")
	f.StringVar(&cert, "tls-cert", "", "TLS certificate (PEM); with --tls-key, serve HTTPS")
	f.StringVar(&key, "tls-key", "", "TLS private key (PEM)")
	f.BoolVar(&allowPlain, "allow-plain-http", false, "serve plain HTTP on a non-loopback address (keys cross the network in clear)")
	f.StringArrayVar(&templates, "template", []string{"busybox:overlay:sh"}, "a template sandboxes may be created from: NAME[:overlay|block[:LANG,...]], the languages its sandboxes run code in (a template built from a recipe: its recipe's when none are given; repeatable)")
	f.DurationVar(&defTimeout, "default-timeout", time.Hour, "a sandbox's timeout when its create names none (0: none)")
	f.DurationVar(&maxTimeout, "max-timeout", 24*time.Hour, "the longest timeout a caller may ask for")
	f.DurationVar(&createTimeout, "create-timeout", 2*time.Minute, "how long a create waits for its sandbox to be ready")
	f.StringVar(&maxFile, "max-file-size", "64Mi", "largest file upload")
	f.StringVar(&replicaID, "replica-id", "", "this replica's id among the servers on the database (default: random)")
	f.DurationVar(&usagePull, "usage-pull", 10*time.Second, "pull the node's usage records (ctl-manager usage) this often (0: never)")
	f.DurationVar(&leaseTTL, "lease-ttl", service.DefaultLeaseTTL, "how long an operation lease lasts unrenewed: a dead replica's operations are taken over after it")
	f.BoolVar(&inFleet, "fleet", false, "place sandboxes on the fleet's nodes (their node processes drive their ctlds) instead of driving --socket's ctld")
	chf.register(f)
	var lf logging.Flags
	lf.Register(f)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c.ran = true
		ctx := cmd.Context()
		var fleet *manager.Fleet
		if inFleet {
			var err error
			if fleet, err = chf.fleet(); err != nil {
				return err
			}
		} else if ok, err := chf.set(); err != nil || ok {
			return usageError{errors.Join(err, errors.New("--cluster-ca and the channel's certificate are for --fleet"))}
		}
		if c.verbose && !f.Changed("log-level") {
			lf.Level = "debug"
		}
		stderr, _ := c.stderr.(*os.File)
		lo, err := lf.Options(logging.UnderJournald(c.getenv, stderr))
		if err != nil {
			return usageError{err}
		}
		tpls, err := parseTemplates(templates)
		if err != nil {
			return err
		}
		if leaseTTL < 300*time.Millisecond || (replicaID != "" && manager.CheckReplicaID(replicaID) != nil) {
			return usageError{errors.New("--lease-ttl must be at least 300ms and --replica-id 1 to 64 of a-z, 0-9 and -")}
		}
		fileCap, err := manager.ParseMemory(maxFile)
		if err != nil {
			return usageError{fmt.Errorf("--max-file-size: %w", err)}
		}
		if (cert == "") != (key == "") {
			return usageError{errors.New("--tls-cert and --tls-key go together")}
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return opError{"serve", err}
		}
		defer ln.Close()
		scheme := "http"
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return opError{"serve", fmt.Errorf("load TLS key pair: %w", err)}
			}
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
			scheme = "https"
		} else if ap, err := netipLoopback(ln.Addr()); err != nil || !ap {
			if !allowPlain {
				return usageError{fmt.Errorf("--listen %s is not a loopback address: give --tls-cert and --tls-key, or --allow-plain-http", listen)}
			}
		}
		st, err := c.openStore(ctx)
		if err != nil {
			return opError{"serve", err}
		}
		defer st.Close()
		log := logging.NewWith(c.stderr, lo)
		log.Info("manager database open", "backend", st.Backend(), "db", redactDB(c.db), "fleet", inFleet)
		// Without the block store (no node key yet, a store that does not
		// open) the service runs; its volume calls answer unavailable.
		var vols service.VolumeBackend
		if bst, repo, err := tf.open(ctx, false); err != nil {
			log.Warn("volumes are unavailable: the block store does not open", "store", tf.store, "err", err)
		} else {
			vols = service.BlockVolumes{Repo: repo, TmpDir: volumeTmp}
			if err := recipeLanguages(ctx, bst, tpls); err != nil {
				log.Warn("templates' languages from their recipes are unknown", "err", err)
			}
		}
		srv := &service.Server{
			Volumes:        vols,
			Manager:        &manager.Manager{Store: st, Client: &api.Client{SocketPath: c.socket}, Log: log, BusyRetries: c.busyRetries, Fleet: fleet},
			Store:          st,
			Log:            log,
			Templates:      tpls,
			DefaultTimeout: defTimeout,
			MaxTimeout:     maxTimeout,
			CreateTimeout:  createTimeout,
			MaxFileBytes:   fileCap,
			ReplicaID:      replicaID,
			LeaseTTL:       leaseTTL,
			UsagePull:      usagePull,
		}
		fmt.Fprintf(c.stdout, "serving on %s://%s\n", scheme, ln.Addr())
		if err := srv.Serve(ctx, ln); err != nil {
			return opError{"serve", err}
		}
		return nil
	}
	return cmd
}

// redactDB is --db fit for a log: a URL's password is left out.
func redactDB(db string) string {
	if manager.IsPostgresURL(db) {
		return manager.RedactDSN(db)
	}
	return db
}

func netipLoopback(a net.Addr) (bool, error) {
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false, err
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}
