package main

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/nodechannel"
)

// channelFlags are the node channel's mTLS files (issue 24): the cluster
// CA and this process's certificate, for `serve --fleet` (a client
// certificate) and `node run` (a server certificate naming the node id).
type channelFlags struct {
	files nodechannel.Files
}

func (cf *channelFlags) register(f *pflag.FlagSet) {
	f.StringVar(&cf.files.CA, "cluster-ca", "", "the cluster CA (PEM) of the node channel: the only issuer trusted on it")
	f.StringVar(&cf.files.Cert, "channel-cert", "", "this process's certificate (PEM) on the node channel, issued by --cluster-ca")
	f.StringVar(&cf.files.Key, "channel-key", "", "its private key (PEM)")
}

func (cf *channelFlags) set() (bool, error) {
	f := cf.files
	n := 0
	for _, s := range []string{f.CA, f.Cert, f.Key} {
		if s != "" {
			n++
		}
	}
	if n != 0 && n != 3 {
		return false, usageError{errors.New("--cluster-ca, --channel-cert and --channel-key go together")}
	}
	return n == 3, nil
}

// fleet is a serve's fleet mode: placement through the database, and the
// node channel's dialer when its files are given (else streams to placed
// sandboxes answer unavailable).
func (cf *channelFlags) fleet() (*manager.Fleet, error) {
	ok, err := cf.set()
	if err != nil || !ok {
		return &manager.Fleet{}, err
	}
	ca, cert, err := nodechannel.Load(cf.files)
	if err != nil {
		return nil, opError{"serve", err}
	}
	dial := nodechannel.Dialer(nodechannel.ClientTLS(ca, cert))
	return &manager.Fleet{Dial: func(ctx context.Context, n manager.FleetNode) (net.Conn, error) {
		return dial(ctx, n.NodeID, n.Channel)
	}}, nil
}

// serveChannel listens on addr and serves the node channel to ctld's
// socket until ctx ends; it returns once listening (errors after that are
// logged by the caller through errc).
func (cf *channelFlags) serveChannel(ctx context.Context, addr, socket string) (net.Addr, <-chan error, error) {
	ca, cert, err := nodechannel.Load(cf.files)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen for the node channel: %w", err)
	}
	errc := make(chan error, 1)
	p := &nodechannel.Proxy{Socket: socket}
	go func() { errc <- nodechannel.Serve(ctx, ln, p.Handler(), nodechannel.ServerTLS(ca, cert), nil) }()
	return ln.Addr(), errc, nil
}
