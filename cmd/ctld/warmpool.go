package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/names"
)

// warmPoolFlag is --warm-pool TEMPLATE=N, repeatable: the warm members
// kept per template.
type warmPoolFlag struct {
	sizes map[string]int
}

func (f *warmPoolFlag) String() string {
	if f == nil || len(f.sizes) == 0 {
		return ""
	}
	var out []string
	for t, n := range f.sizes {
		out = append(out, fmt.Sprintf("%s=%d", t, n))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// Set takes TEMPLATE=N, or several comma-separated (String's form, so
// the config file round-trips); "" sets nothing.
func (f *warmPoolFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if err := f.set(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *warmPoolFlag) set(v string) error {
	tpl, num, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want TEMPLATE=N, got %q", v)
	}
	if err := names.CheckID("template", tpl); err != nil {
		return err
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > 1000 {
		return fmt.Errorf("pool size of %s: want 0..1000, got %q", tpl, num)
	}
	if f.sizes == nil {
		f.sizes = map[string]int{}
	}
	f.sizes[tpl] = n
	return nil
}

func (f *warmPoolFlag) Type() string { return "TEMPLATE=N" }
