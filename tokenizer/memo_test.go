package tokenizer

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMemo(t *testing.T) {
	m := newMemo(3, 16)
	m.put("ab", []uint32{1, 2})
	m.put("abc", []uint32{3})
	m.put("", nil)
	kept, _ := m.get("ab")
	for _, tt := range []struct {
		key  string
		want []uint32
		ok   bool
	}{
		{"ab", []uint32{1, 2}, true},
		{"abc", []uint32{3}, true},
		{"", nil, true},
		{"a", nil, false},
	} {
		got, ok := m.get(tt.key)
		if ok != tt.ok || !slices.Equal(got, tt.want) {
			t.Errorf("get(%q) = %v, %v; want %v, %v", tt.key, got, ok, tt.want, tt.ok)
		}
	}
	// A fourth entry resets the table; slices handed out stay intact.
	m.put("d", []uint32{9})
	if _, ok := m.get("ab"); ok {
		t.Error("ab survived a reset")
	}
	if got, ok := m.get("d"); !ok || !slices.Equal(got, []uint32{9}) {
		t.Errorf("get(d) = %v, %v", got, ok)
	}
	if diff := cmp.Diff([]uint32{1, 2}, kept); diff != "" {
		t.Errorf("a slice from before the reset changed:\n%s", diff)
	}
	// Text beyond the byte limit resets too; text longer than it is not kept.
	m.put(strings.Repeat("x", 16), []uint32{5})
	if _, ok := m.get("d"); ok {
		t.Error("d survived a reset by size")
	}
	if _, ok := m.get(strings.Repeat("x", 16)); !ok {
		t.Error("text at the limit not kept")
	}
	m.put(strings.Repeat("y", 17), []uint32{6})
	if _, ok := m.get(strings.Repeat("y", 17)); ok {
		t.Error("kept text longer than the limit")
	}
}

func TestSplitArray(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  bool
	}{
		{`[]`, nil, false},
		{` [ {"a":1} , {"b":[1,2]} ] `, []string{`{"a":1}`, `{"b":[1,2]}`}, false},
		{`[{"s":"x\"],\\"},"y\\\\"]`, []string{`{"s":"x\"],\\"}`, `"y\\\\"`}, false},
		{`["\\\"]"]`, []string{`"\\\"]"`}, false},
		{`[{"a":"}"}]`, []string{`{"a":"}"}`}, false},
		{`["abc]`, nil, true},
		{`[1,]`, nil, true},
		{`[,1]`, nil, true},
		{`{}`, nil, true},
		{`[{]`, nil, true},
	}
	for _, tt := range tests {
		got, err := splitArray([]byte(tt.in))
		if (err != nil) != tt.err {
			t.Errorf("splitArray(%s) error = %v, want error %v", tt.in, err, tt.err)
			continue
		}
		var strs []string
		for _, g := range got {
			strs = append(strs, string(g))
		}
		if diff := cmp.Diff(tt.want, strs); diff != "" {
			t.Errorf("splitArray(%s) (-want +got):\n%s", tt.in, diff)
		}
	}
}
