package wait

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestSleepsSayWhy holds the rule that every time.Sleep in a test says
// why it sleeps: a comment on its line or the line above, such as
// "synctest: advances the bubble's clock" or what behaviour the wait is
// part of. A sleep that only waits for something to happen is a race on
// a loaded machine: wait.For it instead.
func TestSleepsSayWhy(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	walked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		walked++
		commented := map[int]bool{}
		for _, g := range f.Comments {
			for _, c := range g.List {
				commented[fset.Position(c.End()).Line] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Sleep" {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "time" {
				return true
			}
			line := fset.Position(call.Pos()).Line
			if !commented[line] && !commented[line-1] {
				t.Errorf("%s:%d: time.Sleep without a comment saying why (on its line or the one above)", path, line)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if walked < 100 {
		t.Fatalf("walked %d test files from %s; want the whole module's", walked, root)
	}
}
