// Package scenario holds kernel tests of the sandbox network's parts put
// together as the node puts them together, without the node: a gVisor
// guest (runsc --network=sandbox) in a netns plumbed by netpolicy.Links,
// its policy enforced by the nft Firewall, and test hosts
// (ktest.TestHost) as destinations. It has no code of its own.
package scenario
