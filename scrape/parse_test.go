package scrape

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestParse(t *testing.T) {
	tests := []struct {
		file string
		want Load
	}{
		{"vllm.txt", Load{Engine: EngineVLLM, Running: 5, Waiting: 5, KVUsage: 0.5, BlockSize: 16, NumBlocks: 54000, PrefixQueries: 15000, PrefixHits: 7000}},
		{"vllm-old.txt", Load{Engine: EngineVLLM, Running: 7, Waiting: 0, KVUsage: 0.5, BlockSize: 32, NumBlocks: 1000}},
		{"sglang.txt", Load{Engine: EngineSGLang, Running: 10, Waiting: 2, KVUsage: 0.30000000000000004, BlockSize: 1, NumBlocks: 800000, PrefixQueries: 90000, PrefixHits: 54000}},
		{"sglang-paged.txt", Load{Engine: EngineSGLang, Running: 1, KVUsage: 0.1, BlockSize: 64, NumBlocks: 2000}},
		// llama-server --metrics, as tools/server/server-task.cpp writes it:
		// prompt_tokens counts the tokens processed, not those reused.
		{"llamacpp.txt", Load{Engine: EngineLlamaCpp, Running: 2, Waiting: 3, PrefixQueries: 4800, PrefixHits: 3600, GenerationTokens: 640}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := Parse(f)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseLiteral(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Load
		wantErr bool
	}{
		{name: "empty", in: "", want: Load{}},
		{name: "unknown metrics only", in: "# TYPE foo gauge\nfoo 3\n", want: Load{}},
		{name: "untyped samples", in: "vllm:num_requests_running 2\nvllm:num_requests_waiting{engine=\"0\"} 9\n", want: Load{Running: 2, Waiting: 9}},
		{name: "counter without _total", in: "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits 12\n", want: Load{PrefixHits: 12}},
		{name: "usage clamped", in: "vllm:kv_cache_usage_perc 1.7\n", want: Load{KVUsage: 1}},
		{name: "NaN ignored", in: "vllm:num_requests_running NaN\n", want: Load{}},
		{name: "new usage wins over old", in: "vllm:kv_cache_usage_perc 0.2\nvllm:gpu_cache_usage_perc 0.9\n", want: Load{KVUsage: 0.2}},
		{name: "cache config None", in: "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n", want: Load{}},
		{name: "CPU tier behind a connector", in: "vllm:cache_config_info{block_size=\"16\",num_cpu_blocks=\"4000\",num_gpu_blocks=\"1000\"} 1\n# TYPE vllm:external_prefix_cache_queries counter\nvllm:external_prefix_cache_queries_total 10\n# TYPE vllm:external_prefix_cache_hits counter\nvllm:external_prefix_cache_hits_total 7\n", want: Load{BlockSize: 16, NumBlocks: 1000, CPUBlocks: 4000, ExternalHits: 7}},
		{name: "swap space (no connector)", in: "vllm:cache_config_info{block_size=\"16\",num_cpu_blocks=\"4000\",num_gpu_blocks=\"1000\"} 1\n", want: Load{BlockSize: 16, NumBlocks: 1000}},
		{name: "generated tokens", in: "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{engine=\"0\"} 300\nvllm:generation_tokens_total{engine=\"1\"} 200\n# TYPE sglang:generation_tokens counter\nsglang:generation_tokens_total 7\n", want: Load{GenerationTokens: 507}},
		{name: "malformed value", in: "vllm:num_requests_running abc\n", wantErr: true},
		{name: "unterminated label", in: "vllm:num_requests_running{engine=\"0} 1\n", wantErr: true},
		{name: "type mismatch", in: "# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running counter\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Parse error = %v, wantErr %v", err, tt.wantErr)
			}
			if d := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Load{}, "Engine")); d != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "vllm-old.txt", "sglang.txt", "sglang-paged.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("vllm:num_requests_running{a=\"b\"} 1e308\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Parse(strings.NewReader(string(b)))
		if err != nil {
			return
		}
		if l.KVUsage < 0 || l.KVUsage > 1 {
			t.Errorf("KVUsage %v outside 0..1", l.KVUsage)
		}
		if l.BlockSize < 0 || l.NumBlocks < 0 {
			t.Errorf("negative geometry %d x %d", l.BlockSize, l.NumBlocks)
		}
	})
}

// BenchmarkParse measures one scrape's parse: of vllm.txt (the families
// Parse reads, little else) and of emulator.txt (what kvrouter engine
// serves: mostly latency histograms, which Parse skips unparsed):
//
//	go test -run='^$' -bench=Parse -benchmem ./scrape
func BenchmarkParse(b *testing.B) {
	for _, name := range []string{"vllm.txt", "emulator.txt"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzParseKept: Parse, which parses only the lines of the families it
// reads, finds in every input that parses whole the Load that parsing it
// whole finds.
func FuzzParseKept(f *testing.F) {
	for _, name := range []string{"vllm.txt", "vllm-old.txt", "sglang.txt", "sglang-paged.txt", "emulator.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("# HELP vllm:x_seconds a\n# TYPE vllm:x_seconds histogram\nvllm:x_seconds_bucket{le=\"1\"} 2\nvllm:num_requests_running 3\n  #  TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n"))
	f.Add([]byte("{\"vllm:num_requests_running\"} 4\n# TYPE \"vllm:num_requests_waiting\" gauge\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		whole := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := whole.TextToMetricFamilies(strings.NewReader(string(b)))
		if err != nil {
			return
		}
		want, werr := loadOf(fams)
		got, gerr := Parse(strings.NewReader(string(b)))
		if (gerr != nil) != (werr != nil) {
			t.Fatalf("Parse error %v, parsing whole %v", gerr, werr)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("Parse differs from parsing whole (-whole +Parse):\n%s", d)
		}
	})
}
