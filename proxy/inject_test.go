package proxy

import (
	"testing"

	"github.com/kvrouter/kvrouter/prefix"
)

func TestInjectUsage(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model":"m","prompt":"x"}`, `{"stream_options":{"include_usage":true},"model":"m","prompt":"x"}`},
		{` { "model":"m","prompt":"x"}`, ` {"stream_options":{"include_usage":true}, "model":"m","prompt":"x"}`},
		{`{"model":"m","stream_options":null,"prompt":"x"}`, `{"model":"m","stream_options":{"include_usage":true},"prompt":"x"}`},
		{`{"model":"m","stream_options": {},"prompt":"x"}`, `{"model":"m","stream_options": {"include_usage":true},"prompt":"x"}`},
		{`{"model":"m","stream_options":{ "continuous_usage_stats":true},"prompt":"x"}`,
			`{"model":"m","stream_options":{"include_usage":true, "continuous_usage_stats":true},"prompt":"x"}`},
		{`{"model":"m","stream_options":{"include_usage": false},"prompt":"x"}`, `{"model":"m","stream_options":{"include_usage": true},"prompt":"x"}`},
		{`{"model":"m","stream_options":{"include_usage":null,"x":1},"prompt":"x"}`, `{"model":"m","stream_options":{"include_usage":true,"x":1},"prompt":"x"}`},
	}
	for _, tc := range tests {
		p, err := prefix.Parse([]byte(tc.in))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tc.in, err)
		}
		got := string(appendInjectUsage(nil, []byte(tc.in), p))
		if got != tc.want {
			t.Errorf("appendInjectUsage(%s): got %s, want %s", tc.in, got, tc.want)
		}
		if q, err := prefix.Parse([]byte(got)); err != nil || !q.IncludeUsage {
			t.Errorf("appendInjectUsage(%s) = %s: include_usage not set (%v)", tc.in, got, err)
		}
	}
}
