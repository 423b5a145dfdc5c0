// Package snippet runs a piece of source code in a sandbox with the
// interpreter of its language (the `code` call): the source goes into a
// file of a fresh private directory through the guest agent's files
// calls, the interpreter runs that file through the agent's exec (stdin,
// env, timeout and user as exec's), and the directory is removed after;
// or, for an interpreter that reads its whole program from stdin before
// running it and a call without stdin of its own, the source is the
// stdin of one exec. The source never becomes part of a command line or
// a shell string.
package snippet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
)

// MaxSourceBytes bounds a snippet's source.
const MaxSourceBytes = 256 << 10

// cleanupTimeout bounds the removal of a run's directory (it runs even
// when the caller went away).
const cleanupTimeout = 30 * time.Second

// Language is one language the code call runs: its interpreter (looked
// up on the guest's PATH) and the name of the file the source is written
// to (some interpreters care about the suffix).
type Language struct {
	Name        string
	Interpreter []string
	File        string
	// FromStdin, when set, runs a source given on stdin: only for
	// interpreters that read the whole program before running any of it
	// (a shell reads as it runs: its `read` would take the script's own
	// lines).
	FromStdin []string
}

// Languages is the table of languages, by name.
func Languages() []Language {
	return []Language{
		{Name: "bash", Interpreter: []string{"bash"}, File: "main.sh"},
		{Name: "node", Interpreter: []string{"node"}, File: "main.js", FromStdin: []string{"node", "-"}},
		{Name: "python", Interpreter: []string{"python3"}, File: "main.py", FromStdin: []string{"python3", "-"}},
		{Name: "sh", Interpreter: []string{"sh"}, File: "main.sh"},
	}
}

// Names are the languages' names, sorted.
func Names() []string {
	var out []string
	for _, l := range Languages() {
		out = append(out, l.Name)
	}
	return out
}

// Lookup returns the language called name; an unknown name is an
// invalid-argument error that lists the known ones.
func Lookup(name string) (Language, error) {
	for _, l := range Languages() {
		if l.Name == name {
			return l, nil
		}
	}
	return Language{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "unknown language %s: one of %s", errdefs.Quote(name), strings.Join(Names(), ", "))
}

// CheckServed refuses a language the template does not list.
func CheckServed(lang, template string, served []string) error {
	if slices.Contains(served, lang) {
		return nil
	}
	what := "no language"
	if len(served) > 0 {
		what = strings.Join(served, ", ")
	}
	return errdefs.Errorf(errdefs.CodeInvalidArgument, "the sandbox's template %s serves %s, not %s", errdefs.Quote(template), what, lang)
}

// Request is one run of a snippet.
type Request struct {
	Language   string
	Source     []byte
	Stdin      []byte
	Env        []string
	Cwd        string
	TimeoutSec int64
	// User runs the interpreter (and owns the directory); nil: the
	// sandbox's process user.
	User *api.User
	// StreamsStdin: the Guest gives the interpreter a stdin of its own
	// (a session's stream), so the source never goes on stdin.
	StreamsStdin bool
}

// Plan is the guest calls of one run, as data: make Dir (mode 0700),
// write the source to File (mode 0600), run Exec, remove Dir. A run
// whose caller gives no stdin, in a language that reads its program
// whole from stdin, is one exec with the source as its stdin (Dir and
// File empty): the snippet's own stdin is then empty, as asked.
type Plan struct {
	Dir  string
	File string
	Exec api.ExecRequest
}

// NewPlan checks req and describes its run in a directory named with
// token (random: the name is not guessable, and a directory that exists
// already is an error of the mkdir, never reused).
func NewPlan(req Request, tmpDir, token string) (Plan, error) {
	lang, err := Lookup(req.Language)
	if err != nil {
		return Plan{}, err
	}
	if len(req.Source) > MaxSourceBytes {
		return Plan{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "source of %d bytes: at most %d", len(req.Source), MaxSourceBytes)
	}
	if bytes.IndexByte(req.Source, 0) >= 0 {
		return Plan{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "source has a NUL byte: it must be text")
	}
	if token == "" || strings.ContainsAny(token, "/.") {
		return Plan{}, fmt.Errorf("plan snippet: bad token %q", token)
	}
	if len(req.Stdin) == 0 && !req.StreamsStdin && lang.FromStdin != nil {
		ex := api.ExecRequest{Args: slices.Clone(lang.FromStdin), Env: req.Env, Cwd: req.Cwd, Stdin: req.Source, TimeoutSec: req.TimeoutSec, User: req.User}
		if err := ex.Validate(); err != nil {
			return Plan{}, err
		}
		return Plan{Exec: ex}, nil
	}
	dir := path.Join(tmpDir, ".ctl-code-"+token)
	file := path.Join(dir, lang.File)
	args := append(slices.Clone(lang.Interpreter), file)
	ex := api.ExecRequest{Args: args, Env: req.Env, Cwd: req.Cwd, Stdin: req.Stdin, TimeoutSec: req.TimeoutSec, User: req.User}
	if err := errors.Join(ex.Validate(), api.ValidateFilePath(dir)); err != nil {
		return Plan{}, err
	}
	return Plan{Dir: dir, File: file, Exec: ex}, nil
}

// Guest is what a run needs of the sandbox: the guest agent's files and
// exec calls (manager.Manager has them).
type Guest interface {
	MakeDir(ctx context.Context, id, p string, mode uint32, parents bool, u *api.User) error
	WriteFileFrom(ctx context.Context, id, p string, u *api.User, mode uint32, r io.Reader, size int64) error
	Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error)
	RemoveFile(ctx context.Context, id, p string, recursive bool, u *api.User) error
}

// Runner runs snippets through a Guest.
type Runner struct {
	Guest Guest
	Log   *slog.Logger
	// TmpDir is the guest directory the run's directory is made in
	// ("": /tmp).
	TmpDir string
	// Token returns the random part of a run's directory name (nil: 128
	// random bits in hex).
	Token func() (string, error)
}

func (r Runner) token() (string, error) {
	if r.Token != nil {
		return r.Token()
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate snippet directory name: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Run runs req in sandbox id, streaming the interpreter's output, and
// returns its exit code as exec does (a timeout is exec's error). The
// run's directory is removed whatever happened; a failed removal is
// logged, not returned (the output has gone out already).
func (r Runner) Run(ctx context.Context, id string, req Request, stdout, stderr io.Writer) (int, error) {
	tmp := r.TmpDir
	if tmp == "" {
		tmp = "/tmp"
	}
	tok, err := r.token()
	if err != nil {
		return -1, err
	}
	p, err := NewPlan(req, tmp, tok)
	if err != nil {
		return -1, err
	}
	if p.Dir == "" {
		return r.Guest.Exec(ctx, id, p.Exec, stdout, stderr)
	}
	// Not recursive: the parent must exist, and an existing name fails.
	if err := r.Guest.MakeDir(ctx, id, p.Dir, 0o700, false, req.User); err != nil {
		return -1, fmt.Errorf("make the snippet's directory in %s: %w", id, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := r.Guest.RemoveFile(cctx, id, p.Dir, true, req.User); err != nil {
			logging.OrDiscard(r.Log).Warn("remove a snippet's directory", "sandbox", id, "dir", p.Dir, "err", err)
		}
	}()
	if err := r.Guest.WriteFileFrom(ctx, id, p.File, req.User, 0o600, bytes.NewReader(req.Source), int64(len(req.Source))); err != nil {
		return -1, fmt.Errorf("write the snippet's source in %s: %w", id, err)
	}
	return r.Guest.Exec(ctx, id, p.Exec, stdout, stderr)
}
