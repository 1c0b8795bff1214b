package tokenizer

import (
	"encoding/json"
	"github.com/kvrouter/kvrouter/internal/qwen3"
	"os"
	"path/filepath"
	"testing"

	"github.com/ardanlabs/jinja"
	"github.com/google/go-cmp/cmp"
)

func TestSplitConcats(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"literal first", `{{- '<|im_start|>' + message.role + '\n' }}`, `{{- '<|im_start|>' }}{{ message.role }}{{ '\n' }}`},
		{"both trims", `a{{-'x'+y-}}b`, `a{{- 'x' }}{{ y -}}b`},
		{"calls and filters", `{{ "a" + s.strip('\n') + t | tojson }}`, `{{ "a" }}{{ s.strip('\n') }}{{ t | tojson }}`},
		{"plus inside a string", `{{ 'a+b' + x }}`, `{{ 'a+b' }}{{ x }}`},
		{"plus inside a call", `{{ 'a' + f(x + 1) }}`, `{{ 'a' }}{{ f(x + 1) }}`},
		{"name first", `{{ x + 'a' }}`, `{{ x + 'a' }}`},
		{"numbers", `{{ 1 + 2 }}`, `{{ 1 + 2 }}`},
		{"ternary", `{{ 'a' + x if c else 'b' }}`, `{{ 'a' + x if c else 'b' }}`},
		{"minus", `{{ 'a' + x - 1 }}`, `{{ 'a' + x - 1 }}`},
		{"tilde", `{{ 'a' + x ~ y }}`, `{{ 'a' + x ~ y }}`},
		{"no plus", `{{ x }}`, `{{ x }}`},
		{"statement", `{% set x = 'a' + y %}{{ x }}`, `{% set x = 'a' + y %}{{ x }}`},
		{"comment", `{# {{ 'a' + x }} #}`, `{# {{ 'a' + x }} #}`},
		{"closer in a string", `{{ '}}' + x }}`, `{{ '}}' }}{{ x }}`},
		{"unterminated", `{{ 'a' + x`, `{{ 'a' + x`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := splitConcats(tt.in); got != tt.want {
				t.Errorf("splitConcats(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestSplitConcatsRendersAlike renders Qwen3's chat template as written and
// as rewritten over chats that take each of its branches.
func TestSplitConcatsRendersAlike(t *testing.T) {
	cfg, err := os.ReadFile(filepath.Join(qwen3.Dir(t), "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Template string `json:"chat_template"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	rewritten := splitConcats(c.Template)
	if rewritten == c.Template {
		t.Fatal("nothing rewritten in Qwen3's template")
	}
	orig, err := jinja.Compile(c.Template)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := jinja.Compile(rewritten)
	if err != nil {
		t.Fatal(err)
	}
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	chats := []struct{ name, messages, tools string }{
		{"plain", `[{"role":"system","content":"Be terse."},{"role":"user","content":"Hi"}]`, ``},
		{"tools", `[{"role":"system","content":"S"},{"role":"user","content":"Weather?"}]`, tools},
		{"tools no system", `[{"role":"user","content":"Weather?"}]`, tools},
		{"thinking", `[{"role":"user","content":"Q"},{"role":"assistant","content":"<think>\nhm\n</think>\n\nA"},{"role":"user","content":"Q2"},{"role":"assistant","content":"<think>x</think>B"}]`, ``},
		{"reasoning field", `[{"role":"user","content":"Q"},{"role":"assistant","content":"A","reasoning_content":"R"}]`, ``},
		{"tool calls", `[{"role":"user","content":"W?"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},{"role":"tool","content":"sunny"},{"role":"tool","content":"warm"},{"role":"assistant","content":"Sunny."}]`, tools},
		{"non-string content", `[{"role":"user","content":null},{"role":"assistant","content":42},{"role":"user","content":["a"]}]`, ``},
		{"odd roles", `[{"role":"system","content":"a"},{"role":"system","content":"b"},{"role":"user"}]`, ``},
	}
	for _, ch := range chats {
		t.Run(ch.name, func(t *testing.T) {
			msgs, err := orderedValue([]byte(ch.messages))
			if err != nil {
				t.Fatal(err)
			}
			vars := map[string]jinja.Value{"messages": msgs, "add_generation_prompt": jinja.NewBool(true)}
			if ch.tools != "" {
				if vars["tools"], err = orderedValue([]byte(ch.tools)); err != nil {
					t.Fatal(err)
				}
			}
			want, errW := orig.RenderValues(vars)
			got, errG := fast.RenderValues(vars)
			if (errW == nil) != (errG == nil) {
				t.Fatalf("errors differ: %v vs %v", errW, errG)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rendering differs (-template +rewritten):\n%s", diff)
			}
		})
	}
}
