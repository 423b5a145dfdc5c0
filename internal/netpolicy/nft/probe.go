package nft

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Single-object reads. The library's getters either list a whole kind
// (every chain, set or element of the table, a cost that grows with the
// number of generations) or drop the errno, so "absent" cannot be told
// from a failure. These ask the kernel for one object by name or key.

// get sends one nf_tables GET request and returns the reply; found is
// false when the kernel answers ENOENT.
func (f *Firewall) get(msgType uint16, attrs []netlink.Attribute) (reply []netlink.Message, found bool, err error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, false, fmt.Errorf("open nftables netlink: %w", err)
	}
	defer conn.Close()
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, false, err
	}
	reply, err = conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | int(msgType)), Flags: netlink.Request},
		Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, data...),
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return reply, true, nil
}

func cstr(s string) []byte { return []byte(s + "\x00") }

// chainExists reports whether the table has the chain name.
func (f *Firewall) chainExists(name string) (bool, error) {
	_, ok, err := f.get(unix.NFT_MSG_GETCHAIN, []netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: cstr(f.cfg.table())},
		{Type: unix.NFTA_CHAIN_NAME, Data: cstr(name)},
	})
	if err != nil {
		return false, fmt.Errorf("get nft chain %s: %w", name, err)
	}
	return ok, nil
}

// setExists reports whether the table has the set name.
func (f *Firewall) setExists(name string) (bool, error) {
	_, ok, err := f.get(unix.NFT_MSG_GETSET, []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: cstr(f.cfg.table())},
		{Type: unix.NFTA_SET_NAME, Data: cstr(name)},
	})
	if err != nil {
		return false, fmt.Errorf("get nft set %s: %w", name, err)
	}
	return ok, nil
}

// counterExists reports whether the table has the named counter.
func (f *Firewall) counterExists(name string) (bool, error) {
	typ := make([]byte, 4)
	binary.BigEndian.PutUint32(typ, uint32(nftables.ObjTypeCounter))
	_, ok, err := f.get(unix.NFT_MSG_GETOBJ, []netlink.Attribute{
		{Type: unix.NFTA_OBJ_TABLE, Data: cstr(f.cfg.table())},
		{Type: unix.NFTA_OBJ_NAME, Data: cstr(name)},
		{Type: unix.NFTA_OBJ_TYPE, Data: typ},
	})
	if err != nil {
		return false, fmt.Errorf("get nft counter %s: %w", name, err)
	}
	return ok, nil
}

// element looks up key in set; for a verdict map it also returns the
// chain the element jumps or goes to.
func (f *Firewall) element(set string, key []byte) (found bool, chain string, err error) {
	k, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: key}})
	if err != nil {
		return false, "", err
	}
	el, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_SET_ELEM_KEY | unix.NLA_F_NESTED, Data: k}})
	if err != nil {
		return false, "", err
	}
	list, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_LIST_ELEM | unix.NLA_F_NESTED, Data: el}})
	if err != nil {
		return false, "", err
	}
	reply, ok, err := f.get(unix.NFT_MSG_GETSETELEM, []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: cstr(f.cfg.table())},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: cstr(set)},
		{Type: unix.NFTA_SET_ELEM_LIST_ELEMENTS | unix.NLA_F_NESTED, Data: list},
	})
	if err != nil {
		return false, "", fmt.Errorf("get nft %s element %x: %w", set, key, err)
	}
	if !ok {
		return false, "", nil
	}
	for _, m := range reply {
		if len(m.Data) > 4 {
			if c := findVerdictChain(m.Data[4:]); c != "" {
				chain = c
			}
		}
	}
	return true, chain, nil
}

// findVerdictChain walks an element list message down to the chain of
// its first verdict: ELEMENTS → LIST_ELEM → DATA → VERDICT → CHAIN.
func findVerdictChain(b []byte) string {
	path := []uint16{unix.NFTA_SET_ELEM_LIST_ELEMENTS, unix.NFTA_LIST_ELEM, unix.NFTA_SET_ELEM_DATA, unix.NFTA_DATA_VERDICT}
	for _, typ := range path {
		b = nested(b, typ)
		if b == nil {
			return ""
		}
	}
	return verdictChain(b)
}

// nested returns the payload of the first attribute of type typ in b.
func nested(b []byte, typ uint16) []byte {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil
	}
	for ad.Next() {
		if ad.Type() == typ {
			return ad.Bytes()
		}
	}
	return nil
}
