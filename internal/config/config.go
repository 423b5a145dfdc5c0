// Package config reads ctld's configuration file: a flat TOML file whose
// keys are the flag names of a command and whose values are typed per flag.
// It works over any pflag.FlagSet, so a new flag is a new key without edits
// here. A flag given on the command line wins over the file.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"
)

// DefaultPath is where ctld and ctl-manager look when --config is not given.
const DefaultPath = "/etc/ctld/ctld.toml"

// maxFileBytes bounds the file: a configuration is a few KiB.
const maxFileBytes = 1 << 20

// File is a parsed configuration file: its settings in file order.
type File struct {
	Path     string
	settings []setting
}

type setting struct {
	key  string
	val  any
	line int // 0: unknown
}

// Read parses the file at path. A missing file is an empty File unless
// explicit (named with --config), when it is an error.
func Read(path string, explicit bool) (*File, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return &File{Path: path}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	if len(src) > maxFileBytes {
		return nil, fmt.Errorf("read config %s: larger than %d bytes", path, maxFileBytes)
	}
	return Parse(path, src)
}

// Parse parses src, named path in errors.
func Parse(path string, src []byte) (*File, error) {
	var m map[string]any
	md, err := toml.Decode(string(src), &m)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s:%d: %s", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	file := &File{Path: path}
	for _, k := range md.Keys() {
		if len(k) != 1 {
			continue // inside a table: refused with the table below
		}
		key := k[0]
		file.settings = append(file.settings, setting{key: key, val: m[key], line: lineOf(src, key)})
	}
	return file, nil
}

// lineOf finds the line that sets key at the top level (the TOML library
// does not report positions of keys).
func lineOf(src []byte, key string) int {
	k := regexp.QuoteMeta(key)
	re := regexp.MustCompile(`^\s*(\[+\s*)?(` + k + `|"` + k + `"|'` + k + `')\s*[=\].]`)
	for i, l := range bytes.Split(src, []byte("\n")) {
		if re.Match(l) {
			return i + 1
		}
	}
	return 0
}

func (f *File) errorf(s setting, format string, a ...any) error {
	where := f.Path
	if s.line > 0 {
		where += ":" + strconv.Itoa(s.line)
	}
	return fmt.Errorf("%s: key %q: %s", where, s.key, fmt.Sprintf(format, a...))
}

// Apply sets every flag of fs the file names and the command line did not
// (pflag's Changed). A key that is no flag of fs, or a value of the wrong
// type, is an error naming the file, line and key.
func (f *File) Apply(fs *pflag.FlagSet) error {
	for _, s := range f.settings {
		fl := fs.Lookup(s.key)
		if fl == nil || fl.Name == "help" || fl.Name == "config" {
			return f.errorf(s, "unknown setting (settings are the flags of the command, without the dashes)")
		}
		if err := f.set(fs, fl, s); err != nil {
			return err
		}
	}
	return nil
}

// ApplyKeys sets, for each file key in keys, the flag of fs it maps to
// (unless the command line set it); other keys of the file are ignored:
// they belong to another command sharing the file.
func (f *File) ApplyKeys(fs *pflag.FlagSet, keys map[string]string) error {
	for _, s := range f.settings {
		name, ok := keys[s.key]
		if !ok {
			continue
		}
		fl := fs.Lookup(name)
		if fl == nil {
			return f.errorf(s, "no flag %q to set", name)
		}
		if err := f.set(fs, fl, s); err != nil {
			return err
		}
	}
	return nil
}

// Has says the file sets key.
func (f *File) Has(key string) bool {
	for _, s := range f.settings {
		if s.key == key {
			return true
		}
	}
	return false
}

func (f *File) set(fs *pflag.FlagSet, fl *pflag.Flag, s setting) error {
	if fl.Changed {
		return nil // the command line wins
	}
	text, err := valueText(fl.Value.Type(), s.val)
	if err != nil {
		return f.errorf(s, "%v", err)
	}
	if sv, ok := fl.Value.(pflag.SliceValue); ok {
		if err := sv.Replace(text); err != nil {
			return f.errorf(s, "%v", err)
		}
		fl.Changed = true
		return nil
	}
	if err := fs.Set(fl.Name, text[0]); err != nil {
		return f.errorf(s, "%v", err)
	}
	return nil
}

// valueText checks a TOML value against a flag's type and renders it as
// the flag's text (one element, or several for a slice flag).
func valueText(typ string, v any) ([]string, error) {
	if elem, ok := strings.CutSuffix(typ, "Slice"); ok {
		return listText(elem, v)
	}
	if elem, ok := strings.CutSuffix(typ, "Array"); ok {
		return listText(elem, v)
	}
	s, err := scalarText(typ, v)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

func listText(elem string, v any) ([]string, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("want an array of %s, got %s", elem, tomlType(v))
	}
	out := make([]string, 0, len(arr))
	for i, e := range arr {
		s, err := scalarText(elem, e)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func scalarText(typ string, v any) (string, error) {
	switch {
	case typ == "bool":
		if b, ok := v.(bool); ok {
			return strconv.FormatBool(b), nil
		}
		return "", fmt.Errorf("want true or false, got %s", tomlType(v))
	case strings.HasPrefix(typ, "int") || strings.HasPrefix(typ, "uint") || typ == "count":
		if n, ok := v.(int64); ok {
			return strconv.FormatInt(n, 10), nil
		}
		return "", fmt.Errorf("want an integer, got %s", tomlType(v))
	case strings.HasPrefix(typ, "float"):
		switch n := v.(type) {
		case float64:
			return strconv.FormatFloat(n, 'g', -1, 64), nil
		case int64:
			return strconv.FormatInt(n, 10), nil
		}
		return "", fmt.Errorf("want a number, got %s", tomlType(v))
	}
	// string, duration ("90s") and every other flag type take their text.
	if s, ok := v.(string); ok {
		return s, nil
	}
	if typ == "duration" {
		return "", fmt.Errorf("want a duration string such as \"90s\", got %s", tomlType(v))
	}
	return "", fmt.Errorf("want a string, got %s", tomlType(v))
}

func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("%T", v)
}

// WriteDefault writes a commented configuration file for fs: each flag's
// usage as a comment over its key set to its default, commented out, so
// the file changes nothing until a line is uncommented.
func WriteDefault(w io.Writer, header string, fs *pflag.FlagSet) error {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(header), "\n") {
		b.WriteString(strings.TrimSpace("# "+l) + "\n")
	}
	var err error
	fs.VisitAll(func(fl *pflag.Flag) {
		if err != nil || fl.Hidden || fl.Name == "help" || fl.Name == "config" {
			return
		}
		var lit string
		if lit, err = defaultLiteral(fl); err != nil {
			return
		}
		b.WriteString("\n")
		for _, l := range strings.Split(fl.Usage, "\n") {
			b.WriteString(strings.TrimSpace("# "+l) + "\n")
		}
		fmt.Fprintf(&b, "#%s = %s\n", fl.Name, lit)
	})
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// defaultLiteral is a flag's default as a TOML value of the type Apply
// takes for it.
func defaultLiteral(fl *pflag.Flag) (string, error) {
	if _, ok := fl.Value.(pflag.SliceValue); !ok && (strings.HasSuffix(fl.Value.Type(), "Slice") || strings.HasSuffix(fl.Value.Type(), "Array")) {
		return "", fmt.Errorf("flag --%s: list type %s cannot be read back", fl.Name, fl.Value.Type())
	}
	typ := fl.Value.Type()
	quote := func(s string) string { return strconv.Quote(s) }
	lit := func(elem, s string) string {
		switch {
		case elem == "bool", strings.HasPrefix(elem, "int"), strings.HasPrefix(elem, "uint"), strings.HasPrefix(elem, "float"), elem == "count":
			return s
		}
		return quote(s)
	}
	if sv, ok := fl.Value.(pflag.SliceValue); ok {
		elem := strings.TrimSuffix(strings.TrimSuffix(typ, "Slice"), "Array")
		var parts []string
		for _, e := range sv.GetSlice() {
			parts = append(parts, lit(elem, e))
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	}
	// Other types (ip, ipNet, bytes, ...) take their flag text as a string.
	return lit(typ, fl.DefValue), nil
}
