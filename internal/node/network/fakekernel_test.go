package network

import "github.com/ctld/ctld/internal/node/fakekernel"

// The fake kernel is what the interfaces say.
var (
	_ Netns    = (*fakekernel.Netns)(nil)
	_ Links    = (*fakekernel.Links)(nil)
	_ Firewall = (*fakekernel.Firewall)(nil)
	_ Flows    = (*fakekernel.Flows)(nil)
	_ DNSProxy = (*fakekernel.DNSProxy)(nil)
)
