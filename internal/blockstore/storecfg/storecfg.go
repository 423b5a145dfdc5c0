// Package storecfg names a block store and opens it: a local directory
// (dirstore) or an S3 bucket (s3store), for ctld, its writers and
// ctl-manager alike.
//
// A Config holds no secret, so it may travel in a writer's spec file and in
// logs. S3 credentials come from a credentials file (not readable by group
// or others) or from the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), never from the command line:
// argv is world-readable in /proc.
package storecfg

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/blockstore/s3store"
)

// Config names a block store.
type Config struct {
	// Location is an absolute directory or s3://BUCKET[/PREFIX].
	Location string `json:"location"`
	// Endpoint is the S3 server's base URL ("" = AWS); Region its region
	// ("" = us-east-1); VirtualHosted addresses buckets as host names.
	Endpoint      string `json:"endpoint,omitempty"`
	Region        string `json:"region,omitempty"`
	VirtualHosted bool   `json:"virtual_hosted,omitempty"`
	// CredentialsFile holds the S3 credentials as KEY=VALUE lines
	// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional
	// AWS_SESSION_TOKEN; a systemd EnvironmentFile works). "" = from the
	// environment.
	CredentialsFile string `json:"credentials_file,omitempty"`
}

// Env names of the S3 credentials, in a credentials file or the environment.
const (
	EnvAccessKey    = "AWS_ACCESS_KEY_ID"
	EnvSecretKey    = "AWS_SECRET_ACCESS_KEY"
	EnvSessionToken = "AWS_SESSION_TOKEN"
)

// ErrInvalid marks a refused Config: nothing was opened.
var ErrInvalid = errors.New("invalid block store settings")

// Flags registers the S3 settings (the location is the caller's flag).
func (c *Config) Flags(f *pflag.FlagSet) {
	f.StringVar(&c.Endpoint, "s3-endpoint", "", "S3 endpoint URL of an s3:// block store (default AWS)")
	f.StringVar(&c.Region, "s3-region", "", "S3 region of an s3:// block store (default us-east-1)")
	f.BoolVar(&c.VirtualHosted, "s3-virtual-hosted", false, "address the bucket as a host name (bucket.endpoint) instead of path style")
	f.StringVar(&c.CredentialsFile, "s3-credentials-file", "", "file of AWS_ACCESS_KEY_ID=/AWS_SECRET_ACCESS_KEY= lines (mode 0600; default: those variables from the environment)")
}

// IsS3 says the location is an S3 bucket.
func (c Config) IsS3() bool { return strings.HasPrefix(c.Location, "s3://") }

// Dir is the directory of a directory store ("" for S3).
func (c Config) Dir() string {
	if c.IsS3() {
		return ""
	}
	return c.Location
}

func invalid(f string, a ...any) error {
	return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...)
}

// Check validates the settings without touching anything.
func (c Config) Check() error {
	if !c.IsS3() {
		if !filepath.IsAbs(c.Location) {
			return invalid("block store %q is neither an absolute directory nor s3://BUCKET[/PREFIX]", c.Location)
		}
		if c.Endpoint != "" || c.Region != "" || c.VirtualHosted || c.CredentialsFile != "" {
			return invalid("S3 settings given for the directory store %s", c.Location)
		}
		return nil
	}
	if _, _, err := c.bucket(); err != nil {
		return err
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return invalid("S3 endpoint %q is not an http(s) URL", c.Endpoint)
		}
	}
	if c.CredentialsFile != "" && !filepath.IsAbs(c.CredentialsFile) {
		return invalid("S3 credentials file %q is not absolute", c.CredentialsFile)
	}
	return nil
}

func (c Config) bucket() (bucket, prefix string, err error) {
	rest := strings.TrimPrefix(c.Location, "s3://")
	bucket, prefix, _ = strings.Cut(rest, "/")
	prefix = strings.TrimSuffix(prefix, "/")
	if bucket == "" {
		return "", "", invalid("block store %q names no bucket", c.Location)
	}
	if prefix != "" {
		if err := blockstore.CheckKey(prefix); err != nil {
			return "", "", invalid("block store %q: prefix: %v", c.Location, err)
		}
	}
	return bucket, prefix, nil
}

// Open opens the store. A directory store is made (0700) if missing when
// create is set. An S3 store's credentials are read (file, else getenv)
// and the bucket is probed: a bad setting is an error naming its cause
// (no credentials, bucket not found, access denied, unreachable), so a
// daemon refuses to start instead of failing its first claim.
func (c Config) Open(ctx context.Context, create bool, getenv func(string) string) (blockstore.Store, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	if !c.IsS3() {
		if create {
			if err := os.MkdirAll(c.Location, 0o700); err != nil {
				return nil, fmt.Errorf("make block store dir: %w", err)
			}
		} else if _, err := os.Stat(c.Location); err != nil {
			return nil, fmt.Errorf("block store: %w", err)
		}
		st, err := dirstore.Open(c.Location)
		if err != nil {
			return nil, fmt.Errorf("block store %s: %w", c.Location, err)
		}
		return st, nil
	}
	creds, err := c.credentials(getenv)
	if err != nil {
		return nil, err
	}
	bucket, prefix, _ := c.bucket()
	st, err := s3store.New(s3store.Config{Endpoint: c.Endpoint, Region: c.Region, Bucket: bucket, Prefix: prefix,
		AccessKey: creds[EnvAccessKey], SecretKey: creds[EnvSecretKey], SessionToken: creds[EnvSessionToken], VirtualHosted: c.VirtualHosted})
	if err != nil {
		return nil, invalid("%v", err)
	}
	if err := probe(ctx, st); err != nil {
		return nil, fmt.Errorf("block store %s: %w", c.Location, err)
	}
	return st, nil
}

// probe asks for the bucket, bounded, and names why it failed.
func probe(ctx context.Context, st *s3store.Store) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err := st.Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws(st.Bucket())})
	if err == nil {
		return nil
	}
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) && re.HTTPStatusCode() == 0 {
		re = nil // no answer: the request was never sent
	}
	var ae smithy.APIError
	var ne net.Error
	code := ""
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	switch {
	case re != nil && re.HTTPStatusCode() == http.StatusNotFound:
		return fmt.Errorf("bucket %s not found: %w", st.Bucket(), err)
	case re != nil && (re.HTTPStatusCode() == http.StatusForbidden || re.HTTPStatusCode() == http.StatusUnauthorized):
		return fmt.Errorf("access to bucket %s denied (bad credentials or no permission%s): %w", st.Bucket(), codeNote(code), err)
	case re != nil:
		return fmt.Errorf("bucket %s: server answered HTTP %d%s: %w", st.Bucket(), re.HTTPStatusCode(), codeNote(code), err)
	case errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("S3 endpoint unreachable: %w", err)
	}
	return fmt.Errorf("S3 endpoint unreachable or not S3: %w", err)
}

func codeNote(code string) string {
	if code == "" {
		return ""
	}
	return ", " + code
}

func aws(s string) *string { return &s }

// credentials reads the credentials file, else the environment.
func (c Config) credentials(getenv func(string) string) (map[string]string, error) {
	m := map[string]string{}
	src := "the environment"
	if c.CredentialsFile != "" {
		src = c.CredentialsFile
		fi, err := os.Stat(c.CredentialsFile)
		if err != nil {
			return nil, invalid("S3 credentials file: %v", err)
		}
		// Fail closed: a secret others can read is refused, not used.
		if fi.Mode().Perm()&0o077 != 0 {
			return nil, invalid("S3 credentials file %s is mode %v: readable by group or others (chmod 600)", c.CredentialsFile, fi.Mode().Perm())
		}
		b, err := os.ReadFile(c.CredentialsFile)
		if err != nil {
			return nil, invalid("S3 credentials file: %v", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
			if !ok {
				return nil, invalid("S3 credentials file %s line %d: not KEY=VALUE", c.CredentialsFile, n)
			}
			m[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	} else {
		for _, k := range []string{EnvAccessKey, EnvSecretKey, EnvSessionToken} {
			if v := getenv(k); v != "" {
				m[k] = v
			}
		}
	}
	if m[EnvAccessKey] == "" || m[EnvSecretKey] == "" {
		return nil, invalid("no S3 credentials: %s and %s not set in %s", EnvAccessKey, EnvSecretKey, src)
	}
	return m, nil
}

// Env is the credentials of the environment as KEY=VALUE, for a child
// process (the writer) that opens the same store: a process's environment
// is readable only by its user, unlike its argv.
func Env(getenv func(string) string) []string {
	var env []string
	for _, k := range []string{EnvAccessKey, EnvSecretKey, EnvSessionToken} {
		if v := getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}
