package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Page lengths: the README is the front door, each page of docs/ one task.
const (
	maxREADMELines = 250
	maxPageLines   = 500
)

// historyPhrases narrate an earlier version of kvrouter: the README and
// docs/ describe the present (history is in CHANGELOG.md and git).
var historyPhrases = []string{"before this commit", "the commit before", "previously", "used to be"}

// TestDocsShape: README.md and docs/*.md stay within their lengths, tell
// no history, every page is in the README's map, and every relative link
// points at a file of the repository.
func TestDocsShape(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	readme := readDoc(t, "README.md")
	for _, file := range docFiles(t) {
		text := readDoc(t, file)
		lines := strings.Count(text, "\n")
		if limit := map[bool]int{true: maxREADMELines, false: maxPageLines}[file == "README.md"]; lines > limit {
			t.Errorf("%s: %d lines, want at most %d: move a task to a page of docs/ of its own", file, lines, limit)
		}
		lower := strings.ToLower(text)
		for _, p := range historyPhrases {
			if strings.Contains(lower, p) {
				t.Errorf("%s: %q tells how kvrouter was: say how it is (history goes to CHANGELOG.md)", file, p)
			}
		}
		if page, ok := strings.CutPrefix(file, "docs/"); ok && !strings.Contains(readme, "](docs/"+page+")") {
			t.Errorf("%s is not in the README's map of the docs", file)
		}
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path := filepath.Join("..", "..", filepath.Dir(filepath.FromSlash(file)), filepath.FromSlash(target))
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link to %s: %v", file, m[1], err)
			}
		}
	}
}
