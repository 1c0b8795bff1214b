package dashboard

import (
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// get fetches url and returns the response and its body.
func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

func TestAPIGolden(t *testing.T) {
	srv := httptest.NewServer(New(sample()))
	defer srv.Close()
	tests := []struct {
		path, golden string
	}{
		{"/ui/api/fleet", "fleet.json"},
		{"/ui/api/decisions", "decisions.json"},
		{"/ui/api/decisions?n=1", "decisions_n1.json"},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			resp, body := get(t, srv.URL+tt.path)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200: %s", resp.StatusCode, body)
			}
			if got := resp.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type %q, want application/json", got)
			}
			golden(t, tt.golden, body)
		})
	}
}

func TestFleetDerived(t *testing.T) {
	srv := httptest.NewServer(New(sample()))
	defer srv.Close()
	_, body := get(t, srv.URL+"/ui/api/fleet")
	var f fleetJSON
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		t.Fatal(err)
	}
	tot := f.Totals
	if tot.Replicas != 3 || tot.Healthy != 2 || tot.InFlight != 4 || tot.Completed != 52 || tot.Failed != 1 {
		t.Errorf("totals %+v, want 3 replicas, 2 healthy, 4 in flight, 52 completed, 1 failed", tot)
	}
	if tot.HitActual == nil || *tot.HitActual != 30500.0/50000 {
		t.Errorf("total actual hit rate %v, want %v", tot.HitActual, 30500.0/50000)
	}
	r0, r2 := f.Replicas[0], f.Replicas[2]
	if r0.HitPredicted == nil || *r0.HitPredicted != 0.75 || r0.HitActual == nil || *r0.HitActual != 0.7 {
		t.Errorf("replica 0 hit rates %v/%v, want 0.75/0.7", r0.HitPredicted, r0.HitActual)
	}
	if r0.LoadAgeMS == nil || *r0.LoadAgeMS != 250 || r0.HorizonMS != 90000 {
		t.Errorf("replica 0 load age %v ms, horizon %v ms, want 250, 90000", r0.LoadAgeMS, r0.HorizonMS)
	}
	if r2.HitActual != nil || r2.LoadAgeMS != nil || r2.Events == nil || r2.Events.LastEventAgeMS != nil {
		t.Errorf("replica 2 (unknown figures) %+v: want null hit rate, load age and last event age", r2)
	}
}

func TestDecisionsN(t *testing.T) {
	src := sample()
	srv := httptest.NewServer(New(src))
	defer srv.Close()
	tests := []struct {
		query  string
		status int
		n      int
	}{
		{"", 200, 2},
		{"?n=0", 200, 0},
		{"?n=1", 200, 1},
		{"?n=100000", 200, 2},
		{"?n=-1", 400, 0},
		{"?n=x", 400, 0},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			resp, body := get(t, srv.URL+"/ui/api/decisions"+tt.query)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if tt.status != 200 {
				return
			}
			var d struct{ Decisions []json.RawMessage }
			if err := json.Unmarshal([]byte(body), &d); err != nil {
				t.Fatal(err)
			}
			if d.Decisions == nil || len(d.Decisions) != tt.n {
				t.Errorf("got %d decisions (nil %v), want %d, non-nil", len(d.Decisions), d.Decisions == nil, tt.n)
			}
		})
	}
}

// TestPagesAndMount serves the dashboard the way the router mounts it, next
// to a catch-all route, and checks every path answers with its own content.
func TestPagesAndMount(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/ui/", New(sample()))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "catch-all", http.StatusTeapot) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tests := []struct {
		path, ctype, contains string
		status                int
	}{
		{"/ui", "text/html; charset=utf-8", `<script src="/ui/app.js">`, 200},
		{"/ui/", "text/html; charset=utf-8", `<table id="replicas">`, 200},
		{"/ui/style.css", "text/css; charset=utf-8", "prefers-color-scheme", 200},
		{"/ui/app.js", "text/javascript; charset=utf-8", "/ui/api/fleet", 200},
		{"/ui/api/fleet", "application/json", `"policy": "kv-aware"`, 200},
		{"/ui/nope", "", "", 404},
		{"/elsewhere", "", "catch-all", http.StatusTeapot},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, body := get(t, srv.URL+tt.path)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if tt.ctype != "" && resp.Header.Get("Content-Type") != tt.ctype {
				t.Errorf("Content-Type %q, want %q", resp.Header.Get("Content-Type"), tt.ctype)
			}
			if !strings.Contains(body, tt.contains) {
				t.Errorf("body lacks %q", tt.contains)
			}
		})
	}
	resp, err := http.Post(srv.URL+"/ui/api/fleet", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST status %d, want 405", resp.StatusCode)
	}
}
