// Package lint holds checks of the source that go vet and staticcheck do
// not make.
package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// moduleRoot is the nearest parent of the working directory with a go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = filepath.Dir(dir)
	}
}

// camel is a word no English sentence starts with: a Go name with an inner
// capital (buildNode, isPopulated), the way a doc comment starts.
var camel = regexp.MustCompile(`^[A-Za-z][a-z0-9]*[A-Z]\w*$`)

// firstWord is the first word of a comment group's text.
func firstWord(cg *ast.CommentGroup) string {
	f := strings.Fields(cg.Text())
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// docProblems finds doc comments that do not document what they sit on:
// one that starts with another name (left behind when code moved, or
// stacked on a neighbour's), one that names its declaration with the wrong
// case, and one cut off from its declaration by a blank line (Go then
// attaches it to nothing).
func docProblems(fset *token.FileSet, f *ast.File) []string {
	var out []string
	at := func(n ast.Node) string { return fset.Position(n.Pos()).String() }
	check := func(doc *ast.CommentGroup, name string) {
		w := firstWord(doc)
		if doc == nil || w == name {
			return
		}
		if strings.EqualFold(w, name) || camel.MatchString(w) {
			out = append(out, at(doc)+": the doc comment of "+name+" starts with "+w)
		}
	}
	attached := map[*ast.CommentGroup]bool{}
	var decls []struct {
		pos  token.Pos
		name string
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			check(d.Doc, d.Name.Name)
			attached[d.Doc] = true
			decls = append(decls, struct {
				pos  token.Pos
				name string
			}{d.Pos(), d.Name.Name})
		case *ast.GenDecl:
			attached[d.Doc] = true
			for _, s := range d.Specs {
				var name string
				var doc *ast.CommentGroup
				switch s := s.(type) {
				case *ast.TypeSpec:
					name, doc = s.Name.Name, s.Doc
				case *ast.ValueSpec:
					name, doc = s.Names[0].Name, s.Doc
				default:
					continue
				}
				attached[doc] = true
				if d.Lparen == token.NoPos {
					doc = d.Doc
				}
				check(doc, name)
				decls = append(decls, struct {
					pos  token.Pos
					name string
				}{d.Pos(), name})
			}
		}
	}
	// A free comment that names the next declaration, with only blank
	// lines between them, is its doc comment cut off.
	for _, cg := range f.Comments {
		if attached[cg] || cg == f.Doc {
			continue
		}
		end := fset.Position(cg.End()).Line
		for _, d := range decls {
			if line := fset.Position(d.pos).Line; line > end+1 && blankBetween(fset, f, end, line) && firstWord(cg) == d.name {
				out = append(out, at(cg)+": the doc comment of "+d.name+" is cut off from it by a blank line")
			}
		}
	}
	return out
}

// blankBetween reports whether no code or comment lies on the lines
// strictly between from and to.
func blankBetween(fset *token.FileSet, f *ast.File, from, to int) bool {
	for _, cg := range f.Comments {
		if l := fset.Position(cg.Pos()).Line; l > from && l < to {
			return false
		}
	}
	for _, d := range f.Decls {
		if l := fset.Position(d.End()).Line; l > from && l < to {
			return false
		}
	}
	return true
}

func TestDocComments(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		files++
		for _, msg := range docProblems(fset, f) {
			t.Error(strings.TrimPrefix(msg, root+"/"))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("checked %d Go files under %s; the walk missed the tree", files, root)
	}
}

// TestDocProblemsFindsEachKind: the check flags what it is for and leaves
// ordinary comments alone.
func TestDocProblemsFindsEachKind(t *testing.T) {
	src := `package p

// buildNode wires the node.
// facts are facts.
type facts struct{}

// NinePMount returns a mount.
func ninePMount() {}

// cutOff is cut off from it.

func cutOff() {}

// A free sentence about the file.

func plain() {}

// ok is fine.
func ok() {}

// The wire types.
type (
	// inner is fine.
	inner int
)
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(docProblems(fset, f), "\n")
	for _, want := range []string{
		"p.go:3:1: the doc comment of facts starts with buildNode",
		"p.go:7:1: the doc comment of ninePMount starts with NinePMount",
		"p.go:10:1: the doc comment of cutOff is cut off from it by a blank line",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if n := len(strings.Split(got, "\n")); n != 3 {
		t.Errorf("%d problems, want 3:\n%s", n, got)
	}
}
