// Package s3store is the S3-compatible blockstore backend (AWS SDK for Go
// v2), for a store shared by nodes or kept off the node.
//
// Put is a conditional create (PutObject with If-None-Match: *), so an
// object is written once and a second writer gets blockstore.ErrExists
// from the server itself, not from a racy check; an S3 PUT is atomic, so
// a reader never sees part of an object. Keys pass blockstore.CheckKey
// before any request is made.
package s3store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/ctld/ctld/internal/blockstore"
)

// Config says where the bucket is.
type Config struct {
	// Endpoint is the server's base URL (http://127.0.0.1:7070); empty
	// means AWS itself.
	Endpoint string
	Region   string
	Bucket   string
	// Prefix is put before every key ("" or a key rule path without the
	// trailing '/'), so several stores can share a bucket.
	Prefix    string
	AccessKey string
	SecretKey string
	// SessionToken goes with temporary credentials ("" for none).
	SessionToken string
	// VirtualHosted addresses the bucket as a host name
	// (bucket.endpoint) instead of the default path style (endpoint/bucket).
	VirtualHosted bool
	// HTTPClient replaces the SDK's default client (tests, proxies).
	HTTPClient *http.Client
}

// Store is a blockstore.Store in an S3 bucket.
type Store struct {
	client *s3.Client
	bucket string
	prefix string
}

var _ blockstore.Store = (*Store)(nil)

// New returns the store for cfg. It makes no request.
func New(cfg Config) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3 store: no bucket")
	}
	if cfg.Prefix != "" {
		if err := blockstore.CheckKey(cfg.Prefix); err != nil {
			return nil, fmt.Errorf("s3 store: prefix: %w", err)
		}
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	opts := s3.Options{
		Region: cfg.Region,
		// Path style by default: bucket names need not be DNS names of
		// the endpoint.
		UsePathStyle: !cfg.VirtualHosted,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: cfg.AccessKey, SecretAccessKey: cfg.SecretKey, SessionToken: cfg.SessionToken, Source: "ctld s3store"}, nil
		}),
	}
	if cfg.Endpoint != "" {
		opts.BaseEndpoint = aws.String(cfg.Endpoint)
	}
	if cfg.HTTPClient != nil {
		opts.HTTPClient = cfg.HTTPClient
	}
	p := cfg.Prefix
	if p != "" {
		p += "/"
	}
	return &Store{client: s3.New(opts), bucket: cfg.Bucket, prefix: p}, nil
}

// Client is the SDK client (tests create buckets with it).
func (s *Store) Client() *s3.Client { return s.client }

// Put creates key with data unless it exists (blockstore.ErrExists).
func (s *Store) Put(ctx context.Context, key string, data []byte) error {
	if err := blockstore.CheckKey(key); err != nil {
		return err
	}
	// A private copy: the SDK may re-read the body on a retry after the
	// caller reused its buffer.
	body := bytes.Clone(data)
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        &s.bucket,
		Key:           aws.String(s.prefix + key),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		IfNoneMatch:   aws.String("*"),
	})
	if err != nil {
		// 412: the object exists; 409: a concurrent conditional create
		// of the same key is in progress (AWS says retry; ours is a
		// create-once, so the other writer wins either way).
		if code := errorCode(err); code == "PreconditionFailed" || code == "ConditionalRequestConflict" || httpStatus(err) == http.StatusPreconditionFailed {
			return fmt.Errorf("put %s: %w", key, blockstore.ErrExists)
		}
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Get reads the whole object.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := blockstore.CheckKey(key); err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + key)})
	if err != nil {
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) || httpStatus(err) == http.StatusNotFound {
			return nil, fmt.Errorf("get %s: %w", key, blockstore.ErrNotFound)
		}
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer out.Body.Close()
	// Bounded before the object is authenticated: the announced length
	// first, then the body itself (a server may send no length, or more
	// than it announced).
	limit := blockstore.MaxObjectSize(key)
	if out.ContentLength != nil && *out.ContentLength > limit {
		return nil, fmt.Errorf("get %s: %w: Content-Length %d, at most %d for this kind of object", key, blockstore.ErrTooLarge, *out.ContentLength, limit)
	}
	b, err := io.ReadAll(io.LimitReader(out.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("get %s: read body: %w", key, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("get %s: %w: body over %d bytes, at most %d for this kind of object", key, blockstore.ErrTooLarge, limit, limit)
	}
	// A cut connection must not pass for a short object.
	if out.ContentLength != nil && int64(len(b)) != *out.ContentLength {
		return nil, fmt.Errorf("get %s: body of %d bytes, Content-Length %d", key, len(b), *out.ContentLength)
	}
	return b, nil
}

var _ blockstore.RangeGetter = (*Store)(nil)

// GetRange reads length bytes at off of the object (a chunk in a pack): a
// ranged GET, whose body must be exactly length bytes; no more are read
// (a server that ignores the Range sends the whole object: refused after
// length+1 bytes).
func (s *Store) GetRange(ctx context.Context, key string, off int64, length int, buf []byte) ([]byte, error) {
	if err := blockstore.CheckKey(key); err != nil {
		return nil, err
	}
	if limit := blockstore.MaxObjectSize(key); off < 0 || length <= 0 || off+int64(length) > limit {
		return nil, fmt.Errorf("get %s [%d, +%d): %w: at most %d bytes for this kind of object", key, off, length, blockstore.ErrTooLarge, limit)
	}
	rng := fmt.Sprintf("bytes=%d-%d", off, off+int64(length)-1)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + key), Range: &rng})
	if err != nil {
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) || httpStatus(err) == http.StatusNotFound {
			return nil, fmt.Errorf("get %s: %w", key, blockstore.ErrNotFound)
		}
		if httpStatus(err) == http.StatusRequestedRangeNotSatisfiable {
			// The object ends before the range starts: cut short.
			return nil, fmt.Errorf("get %s %s: %w: %w", key, rng, io.ErrUnexpectedEOF, err)
		}
		return nil, fmt.Errorf("get %s %s: %w", key, rng, err)
	}
	defer out.Body.Close()
	if cl := out.ContentLength; cl != nil && *cl < int64(length) {
		// The object ends inside the range: cut short.
		return nil, fmt.Errorf("get %s %s: Content-Length %d, want %d: %w", key, rng, *cl, length, io.ErrUnexpectedEOF)
	}
	if out.ContentLength != nil && *out.ContentLength != int64(length) {
		return nil, fmt.Errorf("get %s %s: Content-Length %d, want %d", key, rng, *out.ContentLength, length)
	}
	if cap(buf) < length+1 {
		buf = make([]byte, length+1)
	}
	buf = buf[:length+1]
	n, err := io.ReadFull(out.Body, buf)
	switch {
	case err == nil:
		return nil, fmt.Errorf("get %s %s: body over %d bytes", key, rng, length)
	case n < length:
		return nil, fmt.Errorf("get %s %s: body of %d bytes, want %d: %w", key, rng, n, length, io.ErrUnexpectedEOF)
	}
	return buf[:length], nil
}

// Delete removes the object; S3 answers success for a missing key too.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blockstore.CheckKey(key); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + key)})
	if err != nil && httpStatus(err) != http.StatusNotFound {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List returns the keys starting with prefix, sorted.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	infos, err := s.ListInfo(ctx, prefix)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(infos))
	for i, o := range infos {
		keys[i] = o.Key
	}
	return keys, nil
}

var _ blockstore.Lister = (*Store)(nil)

// ListInfo is List with each object's size and LastModified (the
// server's clock, to the second).
func (s *Store) ListInfo(ctx context.Context, prefix string) ([]blockstore.ObjectInfo, error) {
	if err := blockstore.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	var out []blockstore.ObjectInfo
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.prefix + prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", prefix, err)
		}
		for _, o := range page.Contents {
			if o.Key == nil || len(*o.Key) < len(s.prefix) {
				continue
			}
			oi := blockstore.ObjectInfo{Key: (*o.Key)[len(s.prefix):], Size: aws.ToInt64(o.Size)}
			if o.LastModified != nil {
				oi.ModTime = *o.LastModified
			}
			out = append(out, oi)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// Bucket is the store's bucket.
func (s *Store) Bucket() string { return s.bucket }
