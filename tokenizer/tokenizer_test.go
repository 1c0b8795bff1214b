package tokenizer

import (
	"github.com/kvrouter/kvrouter/internal/qwen3"

	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2/v2"
	"github.com/google/go-cmp/cmp"
)

type golden struct {
	Texts []struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	} `json:"texts"`
	Chats []struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
		Rendered string          `json:"rendered"`
		IDs      []uint32        `json:"ids"`
	} `json:"chats"`
}

func readGolden(t testing.TB) golden {
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3_golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func TestQwen3MatchesReference(t *testing.T) {
	tok, err := Load(qwen3.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	g := readGolden(t)
	for i, c := range g.Texts {
		t.Run(fmt.Sprintf("text%d", i), func(t *testing.T) {
			got := tok.Encode(c.Text, nil)
			if diff := cmp.Diff(c.IDs, got); diff != "" {
				t.Errorf("Encode(%q) ids differ from @lenml/tokenizers (-want +got):\n%s", c.Text, diff)
			}
			// Again, now from the memo tables.
			if again := tok.Encode(c.Text, nil); !slices.Equal(again, got) {
				t.Errorf("second Encode(%q) differs from the first", c.Text)
			}
		})
	}
	for i, c := range g.Chats {
		t.Run(fmt.Sprintf("chat%d", i), func(t *testing.T) {
			rendered, err := tok.RenderChat(c.Messages, c.Tools)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.Rendered, rendered); diff != "" {
				t.Errorf("chat template rendering differs from @huggingface/jinja (-want +got):\n%s", diff)
			}
			got, err := tok.Chat(c.Messages, c.Tools, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.IDs, got); diff != "" {
				t.Errorf("chat ids differ (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewTurnExtendsTokens(t *testing.T) {
	tok, err := Load(qwen3.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	// A request ends with the user's message; the next turn appends the
	// assistant's answer and a new question. (Qwen3's template renders a
	// trailing assistant message differently, with think tags, so requests
	// ending there are not the case engines see.)
	turn1 := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}]`
	turn2 := turn1[:len(turn1)-1] + `,{"role":"assistant","content":"Seven."},{"role":"user","content":"Another one?"}]`
	a, err := tok.Chat(json.RawMessage(turn1), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tok.Chat(json.RawMessage(turn2), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) <= len(a) || !slices.Equal(a, b[:len(a)]) {
		t.Errorf("turn 2 does not extend turn 1's tokens:\n%v\n%v", a, b)
	}
}

// TestSplitQwenMatchesRegexp checks the hand-written pre-tokenizer against
// the pattern itself, compiled by regexp2, on the golden corpus and on
// random strings drawn from an alphabet of tricky runes.
func TestSplitQwenMatchesRegexp(t *testing.T) {
	re := regexp2.MustCompile(qwenPattern, regexp2.Unicode)
	check := func(s string) {
		t.Helper()
		var want, got []string
		splitRegexp(re, s, func(p string) { want = append(want, p) })
		splitQwen(s, func(p string) { got = append(got, p) })
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("split(%q) (-regexp2 +hand-written):\n%s", s, diff)
		}
	}
	for _, c := range readGolden(t).Texts {
		check(c.Text)
	}
	alphabet := []rune("aZé日 \t\n\r\u00a0\u3000'sSlLrRvVdDmMtT09٣.,!?(-_\"😀\u0301")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		var b strings.Builder
		for range rng.IntN(24) {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		check(b.String())
	}
}

func FuzzSplitQwen(f *testing.F) {
	for _, s := range []string{"Hello, world!", "a's  b\n\n c", "  \t\r\n x", "日本語 123"} {
		f.Add(s)
	}
	re := regexp2.MustCompile(qwenPattern, regexp2.Unicode)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8Valid(s) {
			return
		}
		var want, got []string
		splitRegexp(re, s, func(p string) { want = append(want, p) })
		splitQwen(s, func(p string) { got = append(got, p) })
		if strings.Join(got, "") != s {
			t.Fatalf("pieces of %q do not add up to it", s)
		}
		if !slices.Equal(want, got) {
			t.Fatalf("split(%q): regexp2 %q, hand-written %q", s, want, got)
		}
	})
}
