package route

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// formulaTerms reads a formula block (lines, as in the source or the
// docs) and returns the terms its Total line sums, and the terms it
// defines: every line "Name = ..." of the block.
func formulaTerms(t *testing.T, lines []string, where string) (total, defined []string) {
	t.Helper()
	word := regexp.MustCompile(`\b[A-Z][A-Za-z]*\b`)
	def := regexp.MustCompile(`^([A-Z][A-Za-z]*)\s+=`)
	for _, l := range lines {
		m := def.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		defined = append(defined, m[1])
		if m[1] == "Total" {
			rhs, _, _ := strings.Cut(l[strings.Index(l, "=")+1:], "   ") // the code's names its functions after a gap
			total = word.FindAllString(rhs, -1)
		}
	}
	if total == nil {
		t.Fatalf("%s: no Total line in the formula", where)
	}
	slices.Sort(total)
	return slices.Compact(total), defined
}

// TestKVAwareDocsFormulaMatchesCode: the model is stated once, in
// kvmodel.go's formula block, and docs/kv-aware.md shows the same
// formula. Both Totals must sum the same terms, and each must define
// every term its Total sums.
func TestKVAwareDocsFormulaMatchesCode(t *testing.T) {
	src, err := os.ReadFile("kvmodel.go")
	if err != nil {
		t.Fatal(err)
	}
	var code []string
	for _, l := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(l, "//") {
			break // the block opens the file
		}
		code = append(code, strings.TrimSpace(strings.TrimPrefix(l, "//")))
	}
	doc, err := os.ReadFile("../docs/kv-aware.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```text\nTotal")
	block, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/kv-aware.md: no ```text block opening with Total")
	}
	docs := strings.Split("Total"+block, "\n")

	codeTotal, codeDefined := formulaTerms(t, code, "kvmodel.go")
	docTotal, docDefined := formulaTerms(t, docs, "docs/kv-aware.md")
	if !slices.Equal(codeTotal, docTotal) {
		t.Errorf("Total sums %v in kvmodel.go, %v in docs/kv-aware.md", codeTotal, docTotal)
	}
	for _, f := range []struct {
		where   string
		total   []string
		defined []string
	}{{"kvmodel.go", codeTotal, codeDefined}, {"docs/kv-aware.md", docTotal, docDefined}} {
		for _, term := range f.total {
			if !slices.Contains(f.defined, term) {
				t.Errorf("%s: Total sums %s, which no line of the formula defines", f.where, term)
			}
		}
	}
}
