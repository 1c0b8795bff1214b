package trace

import (
	"bytes"
	"encoding/json"
	"flag"
	"iter"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// golden compares got, as indented JSON, with testdata/name (rewritten with
// -update).
func golden(t *testing.T, name string, got any) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(b)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

func TestReadGolden(t *testing.T) {
	tests := []struct {
		in, golden string
		read       func(r *os.File) iter.Seq2[Request, error]
	}{
		{"mooncake.jsonl", "mooncake.golden.json", func(f *os.File) iter.Seq2[Request, error] { return ReadMooncake(f) }},
		{"azure.csv", "azure.golden.json", func(f *os.File) iter.Seq2[Request, error] { return ReadAzure(f) }},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.in))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			reqs, err := Collect(tt.read(f))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range reqs {
				if got := promptOf(r.Segments); got != r.Prompt {
					t.Errorf("%s: segments sum to %d, want Prompt %d", r.ID, got, r.Prompt)
				}
			}
			golden(t, tt.golden, reqs)
		})
	}
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, in string
		azure    bool
		wantOK   int
		wantErr  string
	}{
		{"mooncake short hash_ids", `{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1]}`, false, 0, "line 1: 2 hash_ids do not cover input_length 1100"},
		{"mooncake too many hash_ids", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0, 1]}`, false, 0, "do not cover"},
		{"mooncake truncated", "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n{\"timestamp\": 1", false, 1, "line 2: unexpected end of JSON input"},
		{"mooncake no timestamp", `{"input_length": 10, "output_length": 1, "hash_ids": [0]}`, false, 0, "line 1: no timestamp"},
		{"mooncake zero input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, false, 0, "input_length 0: want 1 to"},
		{"azure bad header", "TS,In,Out\n", true, 0, "azure header"},
		{"azure bad tokens", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,abc,4\n", true, 0, `line 2: ContextTokens "abc"`},
		{"azure bad time", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5,4\nyesterday,5,4\n", true, 1, "line 3: parsing time"},
		{"azure short row", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5\n", true, 0, "wrong number of fields"},
		{"empty mooncake", "", false, 0, ""},
		{"mooncake zero slo", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0], "slo_ttft_ms": 0}`, false, 0, "slo_ttft_ms 0: want above 0"},
		{"mooncake huge slo", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0], "slo_itl_ms": 1e12}`, false, 0, "slo_itl_ms 1e+12"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq := ReadMooncake(strings.NewReader(tt.in))
			if tt.azure {
				seq = ReadAzure(strings.NewReader(tt.in))
			}
			reqs, err := Collect(seq)
			if len(reqs) != tt.wantOK {
				t.Errorf("got %d requests before the error, want %d", len(reqs), tt.wantOK)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("got error %v, want none", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestReadFileSorts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.jsonl")
	in := `{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [7]}
{"timestamp": 2, "input_length": 1, "output_length": 1, "hash_ids": [8]}
`
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range w.Requests {
		got = append(got, r.ID)
	}
	if diff := cmp.Diff([]string{"mc-2", "mc-1"}, got); diff != "" || w.Name != "t" {
		t.Errorf("name %q, order (-want +got):\n%s", w.Name, diff)
	}
	if _, err := ReadFile(filepath.Join(dir, "t.txt")); err == nil || !strings.Contains(err.Error(), "unknown format") {
		t.Errorf("got %v, want an unknown format error", err)
	}
}

// realTrace returns the path of a real trace file, skipping the test when
// it is absent.
func realTrace(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(DefaultDir(), traceFile(name))
	if _, err := os.Stat(path); err != nil {
		t.Skipf("real trace absent: %v", err)
	}
	return path
}

func TestMooncakeReal(t *testing.T) {
	realTrace(t, "mooncake-conversation")
	w, err := Generate("mooncake-conversation", GenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := Summary(w.Requests)
	if s.Requests != 12031 {
		t.Errorf("got %d requests, want 12031", s.Requests)
	}
	if mean := float64(s.PromptTokens) / float64(s.Requests); mean < 12034 || mean > 12036 {
		t.Errorf("got mean input %.1f, want ≈ 12035", mean)
	}
	if mean := float64(s.OutputTokens) / float64(s.Requests); mean < 342 || mean > 344 {
		t.Errorf("got mean output %.1f, want ≈ 343", mean)
	}
	for _, r := range w.Requests {
		if r.Segments[0].ID != 0 {
			t.Fatalf("%s starts with block %d, want 0", r.ID, r.Segments[0].ID)
		}
	}
	if d := s.Duration.Minutes(); d < 55 || d > 61 {
		t.Errorf("got duration %.1f min, want about an hour", d)
	}
}

func TestAzureReal(t *testing.T) {
	for _, tt := range []struct {
		name string
		want int
	}{{"azure-conv", 19366}, {"azure-code", 8819}} {
		t.Run(tt.name, func(t *testing.T) {
			realTrace(t, tt.name)
			w, err := Generate(tt.name, GenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(w.Requests); got != tt.want {
				t.Errorf("got %d requests, want %d", got, tt.want)
			}
			if w.Requests[0].At != 0 {
				t.Errorf("first arrival at %v, want 0", w.Requests[0].At)
			}
		})
	}
}

// BenchmarkMooncake reads the whole Mooncake trace and computes every
// request's 16-token engine hashes.
//
//	go test -run='^$' -bench=Mooncake -benchmem ./trace
func BenchmarkMooncake(b *testing.B) {
	data, err := os.ReadFile(realTrace(b, "mooncake-conversation"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("read", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := Collect(ReadMooncake(bytes.NewReader(data))); err != nil {
				b.Fatal(err)
			}
		}
	})
	reqs, err := Collect(ReadMooncake(bytes.NewReader(data)))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hashes", func(b *testing.B) {
		b.ReportAllocs()
		var out []prefix.Hash
		blocks := 0
		for b.Loop() {
			blocks = 0
			for i := range reqs {
				out = reqs[i].EngineHashes(16, out[:0])
				blocks += len(out)
			}
		}
		b.ReportMetric(float64(blocks), "blocks/op")
	})
}

// TestReadSLOClass: a line's slo_class, slo_ttft_ms and slo_itl_ms become
// the request's SLO; bounds without a class name one for them, a class
// without bounds leaves them to the simulator, and a line without any
// has none.
func TestReadSLOClass(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0], "slo_class": "chat", "slo_ttft_ms": 500, "slo_itl_ms": 40.5}
{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1], "slo_ttft_ms": 1000}
{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [2], "slo_class": "batch"}
{"timestamp": 3, "input_length": 10, "output_length": 1, "hash_ids": [3]}`
	reqs, err := Collect(ReadMooncake(strings.NewReader(in)))
	if err != nil {
		t.Fatal(err)
	}
	want := []route.SLO{
		{Class: "chat", TTFT: 500 * time.Millisecond, ITL: 40500 * time.Microsecond},
		{Class: "1s/derived", TTFT: time.Second},
		{Class: "batch"},
		{},
	}
	for i, r := range reqs {
		if r.SLO != want[i] {
			t.Errorf("line %d: SLO %+v, want %+v", i+1, r.SLO, want[i])
		}
	}
}
