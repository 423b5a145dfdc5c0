package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"

	"github.com/ctld/ctld/internal/errdefs"
)

// The file calls go to the guest agent and see the guest's own view of its
// files. A nil *User means the workload's user.
//
//	GET  /v1/sandboxes/{id}/files?path=P[&uid=U&gid=G]            the file, streamed
//	PUT  /v1/sandboxes/{id}/files?path=P[&mode=0644][&uid=U&gid=G] replace it with the body, streamed
//	GET  /v1/sandboxes/{id}/files/stat?path=P[&uid=U&gid=G]       FileInfo
//	GET  /v1/sandboxes/{id}/files/list?path=P[&uid=U&gid=G]       DirListing
//	POST /v1/sandboxes/{id}/files/mkdir                           MkdirRequest
//	POST /v1/sandboxes/{id}/files/remove                          RemoveRequest
//	POST /v1/sandboxes/{id}/files/rename                          RenameRequest

// MaxFileMode is the highest mode a write or mkdir takes: permission bits
// only (no setuid, setgid or sticky bit through the API).
const MaxFileMode = 0o777

// DirListing answers GET .../files/list.
type DirListing struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// MkdirRequest is the body of POST .../files/mkdir. Mode 0 means 0755.
type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"`
	Parents bool   `json:"parents,omitempty"`
	User    *User  `json:"user,omitempty"`
}

// RemoveRequest is the body of POST .../files/remove.
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
	User      *User  `json:"user,omitempty"`
}

// RenameRequest is the body of POST .../files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	User *User  `json:"user,omitempty"`
}

// ValidateUser checks a user a call names (nil: the workload's).
func ValidateUser(u *User) error {
	if u != nil && (u.UID == noID || u.GID == noID) {
		// (uid_t)-1 means "unchanged" to setresuid, not a user.
		return invalid("user %d:%d: %d is not a user or group id", u.UID, u.GID, noID)
	}
	return nil
}

// ValidateFileMode checks the mode of a write or mkdir.
func ValidateFileMode(m uint32) error {
	if m > MaxFileMode {
		return invalid("mode %#o: want permission bits 0 to 0777", m)
	}
	return nil
}

// notRoot refuses the guest's root as the target of a remove or rename.
func notRoot(what, p string) error {
	if path.Clean(p) == "/" {
		return invalid("%s %s: refusing to %s the guest's root directory", what, errdefs.Quote(p), what)
	}
	return nil
}

// Validate checks a mkdir.
func (r MkdirRequest) Validate() error {
	return errors.Join(ValidateFilePath(r.Path), ValidateFileMode(r.Mode), ValidateUser(r.User))
}

// Validate checks a remove.
func (r RemoveRequest) Validate() error {
	if err := ValidateFilePath(r.Path); err != nil {
		return err
	}
	return errors.Join(notRoot("remove", r.Path), ValidateUser(r.User))
}

// Validate checks a rename.
func (r RenameRequest) Validate() error {
	for _, p := range []string{r.From, r.To} {
		if err := ValidateFilePath(p); err != nil {
			return err
		}
	}
	return errors.Join(notRoot("rename", r.From), notRoot("rename", r.To), ValidateUser(r.User))
}

// FileQuery is the query of a file call: the path and the user.
func FileQuery(p string, u *User) url.Values {
	q := url.Values{"path": {p}}
	if u != nil {
		q.Set("uid", strconv.FormatUint(uint64(u.UID), 10))
		q.Set("gid", strconv.FormatUint(uint64(u.GID), 10))
	}
	return q
}

// ReadFileTo copies the file at path inside the sandbox to w, as it comes,
// and returns the bytes copied. A stream that breaks before its end is an
// error, never a short file.
func (c *Client) ReadFileTo(ctx context.Context, id, p string, u *User, w io.Writer) (int64, error) {
	sp, err := sandboxPath(id, "files")
	if err != nil {
		return 0, err
	}
	if err := errors.Join(ValidateFilePath(p), ValidateUser(u)); err != nil {
		return 0, err
	}
	resp, err := c.do(ctx, http.MethodGet, sp, FileQuery(p, u), nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return n, fmt.Errorf("read file %s: %w", p, ctx.Err())
		}
		return n, &errdefs.Error{Code: errdefs.CodeUnavailable, Message: fmt.Sprintf("read file %s: stream broken after %d bytes: %v", p, n, err), Cause: err}
	}
	return n, nil
}

// WriteFileFrom replaces the file at path inside the sandbox with what r
// holds, streamed. size is r's length when known (-1: unknown), so a file
// over ctld's cap is refused before it is sent; mode 0 means 0644.
func (c *Client) WriteFileFrom(ctx context.Context, id, p string, u *User, mode uint32, r io.Reader, size int64) error {
	sp, err := sandboxPath(id, "files")
	if err != nil {
		return err
	}
	if err := errors.Join(ValidateFilePath(p), ValidateUser(u), ValidateFileMode(mode)); err != nil {
		return err
	}
	q := FileQuery(p, u)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode))
	}
	body := io.NopCloser(r)
	h := http.Header{"Content-Type": {"application/octet-stream"}}
	resp, err := c.doSized(ctx, http.MethodPut, sp, q, body, size, h)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// StatFile returns what the guest sees at path (a symlink itself, not its
// target).
func (c *Client) StatFile(ctx context.Context, id, p string, u *User) (FileInfo, error) {
	var out FileInfo
	sp, err := sandboxPath(id, "files", "stat")
	if err != nil {
		return out, err
	}
	if err := errors.Join(ValidateFilePath(p), ValidateUser(u)); err != nil {
		return out, err
	}
	return out, c.callQuery(ctx, http.MethodGet, sp, FileQuery(p, u), nil, &out)
}

// ListDir returns the entries of the directory at path.
func (c *Client) ListDir(ctx context.Context, id, p string, u *User) ([]FileInfo, error) {
	var out DirListing
	sp, err := sandboxPath(id, "files", "list")
	if err != nil {
		return nil, err
	}
	if err := errors.Join(ValidateFilePath(p), ValidateUser(u)); err != nil {
		return nil, err
	}
	if err := c.callQuery(ctx, http.MethodGet, sp, FileQuery(p, u), nil, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// MakeDir makes a directory (and its parents with parents); mode 0 means
// 0755.
func (c *Client) MakeDir(ctx context.Context, id, p string, mode uint32, parents bool, u *User) error {
	return c.fileOp(ctx, id, "mkdir", MkdirRequest{Path: p, Mode: mode, Parents: parents, User: u})
}

// RemoveFile removes a file or an empty directory (a whole tree with
// recursive).
func (c *Client) RemoveFile(ctx context.Context, id, p string, recursive bool, u *User) error {
	return c.fileOp(ctx, id, "remove", RemoveRequest{Path: p, Recursive: recursive, User: u})
}

// RenameFile renames from to to inside the guest.
func (c *Client) RenameFile(ctx context.Context, id, from, to string, u *User) error {
	return c.fileOp(ctx, id, "rename", RenameRequest{From: from, To: to, User: u})
}

func (c *Client) fileOp(ctx context.Context, id, op string, req interface{ Validate() error }) error {
	sp, err := sandboxPath(id, "files", op)
	if err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	var out struct{}
	return c.call(ctx, http.MethodPost, sp, req, &out)
}
