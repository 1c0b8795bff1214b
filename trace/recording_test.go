package trace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// write writes lines to dir/name and returns its path.
func write(t *testing.T, dir, name string, lines ...string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadFilesMerges: two routers' recordings read as one trace in time
// order, aligned on their start_unix_ms; a start_unix_ms later in a file
// (a second recording appended) moves the times after it; ids stay unique.
func TestReadFilesMerges(t *testing.T) {
	dir := t.TempDir()
	a := write(t, dir, "a.jsonl",
		`{"start_unix_ms":1000000,"timestamp":0,"input_length":20,"output_length":1,"hash_ids":[1],"block_size":16,"session":"s1"}`,
		`{"timestamp":300,"input_length":20,"output_length":1,"hash_ids":[1],"block_size":16,"session":"s1"}`,
		`{"start_unix_ms":1002000,"timestamp":50,"input_length":20,"output_length":1,"hash_ids":[1],"block_size":16}`)
	write(t, dir, "b.jsonl",
		`{"start_unix_ms":1000100,"timestamp":100,"input_length":16,"output_length":1,"hash_ids":[1],"block_size":16,"session":"s2"}`)
	paths, err := Expand(a + "," + filepath.Join(dir, "b*"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := ReadFiles(paths...)
	if err != nil {
		t.Fatal(err)
	}
	var got []time.Duration
	ids := map[string]bool{}
	for _, r := range w.Requests {
		got = append(got, r.At)
		ids[r.ID] = true
	}
	want := []time.Duration{0, 200 * time.Millisecond, 300 * time.Millisecond, 2050 * time.Millisecond}
	if len(got) != len(want) {
		t.Fatalf("arrivals %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("arrivals %v, want %v", got, want)
		}
	}
	if len(ids) != 4 {
		t.Errorf("ids %v: want 4 distinct", ids)
	}
	if s := w.Requests[1].Session; s != "s2" || w.Requests[1].Prompt != 16 || len(w.Requests[1].Segments) != 1 {
		t.Errorf("b's request: %+v, want session s2, 16 tokens in one block", w.Requests[1])
	}
	if tail := w.Requests[0].Segments[1]; tail.Tokens != 4 || tail.ID == w.Requests[2].Segments[1].ID {
		t.Errorf("tails %+v %+v: want 4 tokens each, of their own", tail, w.Requests[2].Segments[1])
	}
	if _, err := Expand(filepath.Join(dir, "none*")); err == nil {
		t.Error("a pattern matching nothing: no error")
	}
}

// TestCalibrate: a text-mode recording's ids stand for 16 estimated
// tokens where the engine counted 120 tokens over 6 ids: read, each id stands for 20
// tokens in every request (the same size throughout), so the prefix the
// next request shares is 20 tokens a shared id, as the engine saw it.
func TestCalibrate(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "rec.jsonl",
		`{"timestamp":0,"input_length":41,"output_length":1,"hash_ids":[1,2],"block_size":16,"tokens_estimated":true}`,
		`{"timestamp":1,"input_length":79,"output_length":1,"hash_ids":[1,2,3,4],"block_size":16,"tokens_estimated":true}`)
	w, err := ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	a, b := w.Requests[0], w.Requests[1]
	for _, r := range []Request{a, b} {
		for _, s := range r.Segments[:2] {
			if s.Tokens != 20 {
				t.Fatalf("%s: segments %+v, want ids of 20 tokens", r.ID, r.Segments)
			}
		}
	}
	// 120 tokens over 6 ids: 20 each. The first keeps a tail of 1 token,
	// the second's ids cover 80 of its 79.
	if a.Prompt != 41 || len(a.Segments) != 3 || a.Segments[2].Tokens != 1 || b.Prompt != 80 || len(b.Segments) != 4 {
		t.Errorf("prompts %d %d, segments %+v %+v: want 41 (a tail of 1) and 80 (no tail)", a.Prompt, b.Prompt, a.Segments, b.Segments)
	}
	// Without tokens_estimated the block size is the engine's: kept.
	p = write(t, dir, "exact.jsonl", `{"timestamp":0,"input_length":42,"output_length":1,"hash_ids":[1,2],"block_size":16}`)
	if w, err = ReadFile(p); err != nil || w.Requests[0].Segments[0].Tokens != 16 || w.Requests[0].Prompt != 42 {
		t.Errorf("exact recording read as %+v, %v", w.Requests, err)
	}
}

// FuzzReadMooncake: any bytes read as a trace or recording give requests
// whose segments add up to their prompt, or an error; never a panic.
func FuzzReadMooncake(f *testing.F) {
	f.Add([]byte(`{"start_unix_ms":1,"timestamp":0,"input_length":42,"output_length":1,"hash_ids":[1,2],"block_size":16,"tokens_estimated":true,"session":"s"}`))
	f.Add([]byte(`{"timestamp":0,"input_length":600,"output_length":1,"hash_ids":[1,2]}`))
	f.Add([]byte(`{"timestamp":1e300,"input_length":1,"hash_ids":[]}` + "\n" + `{"timestamp":0,"input_length":1,"hash_ids":[],"block_size":65536}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var est []estimated
		var origin int64
		reqs, err := Collect(readMooncake(strings.NewReader(string(b)), 1, &origin, &est))
		if err != nil {
			return
		}
		calibrate(reqs, est)
		for _, r := range reqs {
			if r.At < 0 || r.Prompt < 1 || promptOf(r.Segments) != r.Prompt {
				t.Fatalf("request %+v: segments of %d tokens", r, promptOf(r.Segments))
			}
		}
	})
}

// TestRecordingWithoutIDs: a recorded request the router hashed no block
// of (a short prompt; token mode before the block sizes are known) is a
// prompt of its own.
func TestRecordingWithoutIDs(t *testing.T) {
	p := write(t, t.TempDir(), "rec.jsonl",
		`{"timestamp":0,"input_length":313,"output_length":1,"hash_ids":[],"block_size":16}`,
		`{"timestamp":1,"input_length":313,"output_length":1,"hash_ids":[],"block_size":16}`)
	w, err := ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	a, b := w.Requests[0], w.Requests[1]
	if a.Prompt != 313 || len(a.Segments) != 1 || a.Segments[0].ID == b.Segments[0].ID {
		t.Errorf("requests %+v %+v: want 313 tokens each, of their own", a, b)
	}
}
