package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
)

// parseMode parses an octal mode flag ("" is 0: the node's default).
func parseMode(s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > api.MaxFileMode {
		return 0, usageError{fmt.Errorf("--mode %q: want octal permission bits 0 to 0777, like 0644", s)}
	}
	return uint32(m), nil
}

func (c *cli) fileCommand() *cobra.Command {
	file := group("file", "Read, write and list files inside a sandbox (as the guest sees them)")
	var user string
	file.PersistentFlags().StringVar(&user, "user", "", "act as UID[:GID] (numeric); default: the sandbox's process user")
	// fileAction checks --user and hands it to fn.
	fileAction := func(what func([]string) string, fn func(ctx context.Context, u *api.User, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			u, err := parseUser(user)
			if err != nil {
				return err
			}
			return c.action(what, func(ctx context.Context, args []string) error { return fn(ctx, u, args) })(cmd, args)
		}
	}
	on := func(verb string) func([]string) string {
		return func(args []string) string { return verb + " " + args[1] + " in sandbox " + args[0] }
	}

	var putMode string
	put := &cobra.Command{
		Use:   "put ID PATH [LOCALFILE|-] [--mode 0644]",
		Short: "Write a file inside the sandbox from LOCALFILE or stdin, streamed",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || len(args) > 3 {
				return usageError{fmt.Errorf("%s takes ID PATH [LOCALFILE|-], got %d arguments", cmd.CommandPath(), len(args))}
			}
			return nil
		},
	}
	put.Flags().StringVar(&putMode, "mode", "", "mode of the file (octal; default 0644)")
	put.RunE = fileAction(on("put file"), func(ctx context.Context, u *api.User, args []string) error {
		mode, err := parseMode(putMode)
		if err != nil {
			return err
		}
		var r io.Reader = c.stdin
		size := int64(-1)
		if len(args) == 3 && args[2] != "-" {
			f, err := os.Open(args[2])
			if err != nil {
				return fmt.Errorf("read local data: %w", err)
			}
			defer f.Close()
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				size = st.Size()
			}
			r = f
		}
		cr := &countingReader{r: r}
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		if err := m.WriteFileFrom(ctx, args[0], args[1], u, mode, cr, size); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"sandbox": args[0], "path": args[1], "bytes": cr.n})
		}
		fmt.Fprintf(c.stdout, "wrote %d bytes to %s:%s\n", cr.n, args[0], args[1])
		return nil
	})

	get := &cobra.Command{Use: "get ID PATH", Short: "Print a file from inside the sandbox, streamed", Args: exactArgs(2, "ID PATH")}
	get.RunE = fileAction(func(args []string) string { return "get file " + args[1] + " from sandbox " + args[0] }, func(ctx context.Context, u *api.User, args []string) error {
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		if c.json {
			// encoding/json renders []byte as base64, so binary files
			// survive; JSON is whole, so this one is buffered.
			var data bytes.Buffer
			if _, err := m.ReadFileTo(ctx, args[0], args[1], u, &data); err != nil {
				return err
			}
			return c.printJSON(map[string]any{"sandbox": args[0], "path": args[1], "data": data.Bytes()})
		}
		_, err = m.ReadFileTo(ctx, args[0], args[1], u, c.stdout)
		return err
	})

	ls := &cobra.Command{Use: "ls ID PATH", Short: "List a directory inside the sandbox", Args: exactArgs(2, "ID PATH")}
	ls.RunE = fileAction(on("list"), func(ctx context.Context, u *api.User, args []string) error {
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		es, err := m.ListDir(ctx, args[0], args[1], u)
		if err != nil {
			return err
		}
		if c.json {
			if es == nil {
				es = []api.FileInfo{}
			}
			return c.printJSON(api.DirListing{Path: args[1], Entries: es})
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		for _, e := range es {
			fmt.Fprintln(tw, fileLine(e, c.outText))
		}
		return tw.Flush()
	})

	stat := &cobra.Command{Use: "stat ID PATH", Short: "Show a file's type, mode, owner, size and time inside the sandbox", Args: exactArgs(2, "ID PATH")}
	stat.RunE = fileAction(on("stat"), func(ctx context.Context, u *api.User, args []string) error {
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		fi, err := m.StatFile(ctx, args[0], args[1], u)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(fi)
		}
		fmt.Fprintln(c.stdout, fileLine(fi, c.outText))
		return nil
	})

	var recursive bool
	rm := &cobra.Command{Use: "rm ID PATH [-r]", Short: "Remove a file or empty directory inside the sandbox (-r: a whole tree)", Args: exactArgs(2, "ID PATH")}
	rm.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and everything in it")
	rm.RunE = fileAction(on("remove"), func(ctx context.Context, u *api.User, args []string) error {
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		return m.RemoveFile(ctx, args[0], args[1], recursive, u)
	})

	var parents bool
	var dirMode string
	mkdir := &cobra.Command{Use: "mkdir ID PATH [-p] [--mode 0755]", Short: "Make a directory inside the sandbox", Args: exactArgs(2, "ID PATH")}
	mkdir.Flags().BoolVarP(&parents, "parents", "p", false, "make missing parents too; an existing directory is no error")
	mkdir.Flags().StringVar(&dirMode, "mode", "", "mode of the directory (octal; default 0755)")
	mkdir.RunE = fileAction(on("mkdir"), func(ctx context.Context, u *api.User, args []string) error {
		mode, err := parseMode(dirMode)
		if err != nil {
			return err
		}
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		return m.MakeDir(ctx, args[0], args[1], mode, parents, u)
	})

	mv := &cobra.Command{Use: "mv ID FROM TO", Short: "Rename a file or directory inside the sandbox", Args: exactArgs(3, "ID FROM TO")}
	mv.RunE = fileAction(on("rename"), func(ctx context.Context, u *api.User, args []string) error {
		m, done, err := c.manager(ctx, false)
		if err != nil {
			return err
		}
		defer done()
		return m.RenameFile(ctx, args[0], args[1], args[2], u)
	})
	file.AddCommand(put, get, ls, stat, rm, mkdir, mv)
	return file
}

// fileLine is one file as ls -l shows it: mode, owner, size, time, name
// (and a symlink's target).
// fileLine is an ls/stat line; esc prints the guest's name and link
// target (escaped on a terminal).
func fileLine(e api.FileInfo, esc func(string) string) string {
	name := esc(e.Name)
	if e.Link != "" {
		name += " -> " + esc(e.Link)
	}
	return fmt.Sprintf("%s\t%d:%d\t%d\t%s\t%s", fs.FileMode(e.Mode), e.UID, e.GID, e.Size,
		time.Unix(e.ModUnix, 0).UTC().Format("2006-01-02 15:04"), name)
}

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
