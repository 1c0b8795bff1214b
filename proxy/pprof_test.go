package proxy

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestPprof: with Pprof the admin surface serves a CPU profile to a client
// with an admin key and refuses (401, counted) one without; without
// Pprof /debug/pprof/ is a 404.
func TestPprof(t *testing.T) {
	up := httptest.NewServer(http.NotFoundHandler())
	defer up.Close()
	get := func(url, key string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	const key = "adm-0123456789abcdef"
	_, _, admin := serveLimited(t, func(c *Config) { c.Pprof, c.AdminAPIKeys = true, keyFile(t, key+" ops") }, up.URL)

	// The profile's duration is the behaviour under test: one second of
	// CPU sampling, the shortest pprof takes.
	resp, body := get(admin+"/debug/pprof/profile?seconds=1", key)
	if resp.StatusCode != 200 {
		t.Fatalf("CPU profile with the admin key: status %d (%s)", resp.StatusCode, body)
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("CPU profile is not gzip: %v (%d bytes)", err, len(body))
	}
	prof, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(prof, []byte("cpu")) || !bytes.Contains(prof, []byte("nanoseconds")) {
		t.Errorf("CPU profile: %d bytes, err %v; want a profile of cpu nanoseconds", len(prof), err)
	}
	if resp, body := get(admin+"/debug/pprof/heap?debug=1", key); resp.StatusCode != 200 || !bytes.Contains(body, []byte("heap profile")) {
		t.Errorf("heap profile: status %d, %.60q", resp.StatusCode, body)
	}

	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/", "/debug/pprof/goroutine"} {
		if resp, _ := get(admin+path, ""); resp.StatusCode != 401 {
			t.Errorf("GET %s without a key: status %d, want 401", path, resp.StatusCode)
		}
	}
	if resp, _ := get(admin+"/debug/pprof/cmdline", key); resp.StatusCode == 200 {
		t.Errorf("GET /debug/pprof/cmdline: status 200; the command line is not served")
	}
	_, text := get(admin+"/metrics", key)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got := total(mfs, "kvrouter_admin_errors_total", "code", codeInvalidKey); got != 3 {
		t.Errorf("kvrouter_admin_errors_total{code=%q} = %v, want 3", codeInvalidKey, got)
	}

	_, _, off := serveLimited(t, nil, up.URL)
	if resp, body := get(off+"/debug/pprof/", ""); resp.StatusCode != 404 {
		t.Errorf("GET /debug/pprof/ without --pprof: status %d (%s), want 404", resp.StatusCode, body)
	}
	if resp, _ := get(off+"/debug/pprof/profile?seconds=1", ""); resp.StatusCode != 404 {
		t.Errorf("GET /debug/pprof/profile without --pprof: status %d, want 404", resp.StatusCode)
	}
}
