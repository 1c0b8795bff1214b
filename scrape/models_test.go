package scrape

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// modelList returns a JSON model list of n entries "m0", "m1", ...
func modelList(n int) string {
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"m%d","object":"model"}`, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// modelsServer serves body at /v1/models with status code; chunked sends
// it without a Content-Length.
func modelsServer(code int, body string, chunked bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if !chunked {
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		}
		w.WriteHeader(code)
		if !chunked {
			w.Write([]byte(body))
			return
		}
		for len(body) > 0 {
			n := min(len(body), 64<<10)
			w.Write([]byte(body[:n]))
			w.(http.Flusher).Flush()
			body = body[n:]
		}
	})
}

func TestListModels(t *testing.T) {
	vllm, err := os.ReadFile(filepath.Join("testdata", "vllm-models.json"))
	if err != nil {
		t.Fatal(err)
	}
	huge := `{"object":"list","pad":"` + strings.Repeat("x", MaxModelsBody) + `","data":[]}`
	tests := []struct {
		name      string
		code      int
		body      string
		chunked   bool
		want      []Model
		wantErr   string // substring of the error after "scrape URL: "
		wantLimit bool   // the error wraps ErrLimit
	}{
		{name: "vllm base and lora", code: 200, body: string(vllm), want: []Model{
			{ID: "Qwen/Qwen3-8B"}, {ID: "sql-lora", Parent: "Qwen/Qwen3-8B"},
		}},
		{name: "sglang without parent", code: 200, body: `{"object":"list","data":[{"id":"qwen","object":"model","created":1,"owned_by":"sglang","root":"qwen","max_model_len":4096}]}`,
			want: []Model{{ID: "qwen"}}},
		{name: "key order free", code: 200, body: `{"data":[{"parent":"b","id":"a"}],"object":"list"}`, want: []Model{{ID: "a", Parent: "b"}}},
		{name: "empty list", code: 200, body: `{"object":"list","data":[]}`, want: []Model{}},
		{name: "exactly the most models", code: 200, body: modelList(MaxModels), want: nil}, // checked by length below
		{name: "404", code: 404, body: "Not Found", wantErr: "status 404 Not Found"},
		{name: "503", code: 503, body: `{"error":{"message":"loading"}}`, wantErr: "status 503 Service Unavailable"},
		{name: "truncated", code: 200, body: `{"object":"list","data":[{"id":"a"},`, wantErr: "model 1: unexpected EOF"},
		{name: "truncated in an entry", code: 200, body: `{"object":"list","data":[{"id":"a`, wantErr: "model 0: unexpected EOF"},
		{name: "truncated in a key", code: 200, body: `{"obj`, wantErr: "unexpected EOF"},
		{name: "empty body", code: 200, body: ``, wantErr: "unexpected EOF"},
		{name: "not json", code: 200, body: `<html>hi</html>`, wantErr: "invalid character"},
		{name: "array at top", code: 200, body: `[{"id":"a"}]`, wantErr: "got [, want {"},
		{name: "no data", code: 200, body: `{"object":"list"}`, wantErr: `no "data" field`},
		{name: "data twice", code: 200, body: `{"data":[],"data":[]}`, wantErr: `two "data" fields`},
		{name: "data not a list", code: 200, body: `{"data":{"id":"a"}}`, wantErr: "data: got {, want ["},
		{name: "entry without id", code: 200, body: `{"data":[{"object":"model"}]}`, wantErr: "model 0: no id"},
		{name: "id not a string", code: 200, body: `{"data":[{"id":7}]}`, wantErr: "model 0: json: cannot unmarshal number"},
		{name: "id too long", code: 200, body: `{"data":[{"id":"a"},{"id":"` + strings.Repeat("x", MaxModelID+1) + `"}]}`,
			wantErr: "model 1: over limit: id of 513 bytes, more than 512", wantLimit: true},
		{name: "parent too long", code: 200, body: `{"data":[{"id":"a","parent":"` + strings.Repeat("x", MaxModelID+1) + `"}]}`,
			wantErr: "model 0: over limit: parent of 513 bytes", wantLimit: true},
		{name: "too many models", code: 200, body: modelList(MaxModels + 1), wantErr: "over limit: more than 4096 models", wantLimit: true},
		{name: "oversized with length", code: 200, body: huge, wantErr: "over limit: body of 4194340 bytes, more than 4194304", wantLimit: true},
		{name: "oversized chunked", code: 200, body: huge, chunked: true, wantErr: "over limit: body over 4194304 bytes", wantLimit: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(modelsServer(tt.code, tt.body, tt.chunked))
			defer srv.Close()
			got, err := ListModels(t.Context(), srv.Client(), srv.URL+"/")
			if tt.wantErr != "" {
				prefix := "scrape " + srv.URL + "/v1/models: "
				if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want %q...%q", err, prefix, tt.wantErr)
				}
				if errors.Is(err, ErrLimit) != tt.wantLimit {
					t.Errorf("got errors.Is(err, ErrLimit) %v, want %v", !tt.wantLimit, tt.wantLimit)
				}
				if got != nil {
					t.Errorf("got models %v with the error, want nil", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if tt.want == nil {
				if len(got) != MaxModels || got[MaxModels-1].ID != fmt.Sprintf("m%d", MaxModels-1) {
					t.Errorf("got %d models, want %d", len(got), MaxModels)
				}
				return
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("models mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// TestListModelsDead checks a server that hangs (the context's deadline
// ends the call) and one that is gone.
func TestListModelsDead(t *testing.T) {
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hang.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := ListModels(ctx, nil, hang.URL); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hanging server: got %v, want context.DeadlineExceeded", err)
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	if _, err := ListModels(t.Context(), nil, gone.URL); err == nil || !strings.HasPrefix(err.Error(), "scrape "+gone.URL+"/v1/models: ") {
		t.Errorf("closed server: got %v, want a scrape error", err)
	}
}

// replicaMux serves /metrics from testdata and /v1/models from a list the
// test changes (nil: 404), counting model requests.
type replicaMux struct {
	metrics http.Handler
	mu      sync.Mutex
	list    string
	hits    atomic.Int64
}

func (m *replicaMux) set(list string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.list = list
}

func (m *replicaMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/models" {
		m.metrics.ServeHTTP(w, r)
		return
	}
	m.hits.Add(1)
	m.mu.Lock()
	list := m.list
	m.mu.Unlock()
	if list == "" {
		http.NotFound(w, r)
		return
	}
	w.Write([]byte(list))
}

// TestScraperModels checks the model loop's period, hook, Status and its
// independence from metrics errors, on a fake clock.
func TestScraperModels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const base = `{"object":"list","data":[{"id":"base","parent":null}]}`
		const lora = `{"object":"list","data":[{"id":"base","parent":null},{"id":"lora","parent":"base"}]}`
		m := &replicaMux{metrics: serveFile(t, "vllm.txt")}
		m.set(base)
		var mu sync.Mutex
		var lists [][]Model
		var errs atomic.Int64
		s := &Scraper{
			Client:         &http.Client{Transport: handlerTransport{m}},
			ModelsInterval: time.Second,
			OnModels: func(id string, ms []Model) {
				mu.Lock()
				defer mu.Unlock()
				lists = append(lists, ms)
			},
			OnError: func(string, error) { errs.Add(1) },
		}
		const id = "http://replica-a:8000"
		s.Add(id)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go s.Run(ctx)

		time.Sleep(time.Nanosecond) // synctest: advances the bubble's clock
		synctest.Wait()
		st, _ := s.Status(id)
		if d := cmp.Diff([]Model{{ID: "base"}}, st.Models); d != "" || st.ModelsErr != nil || !st.ModelsAt.Equal(time.Now().Add(-time.Nanosecond)) {
			t.Errorf("at start: got %+v, want the base model listed at once, 1 ns ago (models -want +got:\n%s)", st, d)
		}
		m.set(lora)
		time.Sleep(time.Second) // synctest: advances the bubble's clock
		synctest.Wait()
		m.set("")
		time.Sleep(time.Second) // synctest: advances the bubble's clock
		synctest.Wait()
		st, _ = s.Status(id)
		if st.ModelsErr == nil || !strings.Contains(st.ModelsErr.Error(), "status 404") || len(st.Models) != 2 {
			t.Errorf("after a 404: got %+v, want the error and the last list kept", st)
		}
		if st.Errors != 0 || st.Last.Running != 5 || errs.Load() != 0 {
			t.Errorf("metrics: got %d errors (hook %d), Running %d; want 0, 0, 5", st.Errors, errs.Load(), st.Last.Running)
		}
		mu.Lock()
		want := [][]Model{{{ID: "base"}}, {{ID: "base"}, {ID: "lora", Parent: "base"}}}
		if d := cmp.Diff(want, lists); d != "" {
			t.Errorf("OnModels mismatch (-want +got):\n%s", d)
		}
		mu.Unlock()
		if got := m.hits.Load(); got != 3 {
			t.Errorf("got %d model requests in 2 s, want 3", got)
		}

		s.Remove(id)
		time.Sleep(5 * time.Second) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := m.hits.Load(); got != 3 {
			t.Errorf("removed target: got %d more model requests, want 0", got-3)
		}
	})
}

// TestScraperModelsOff checks that a negative ModelsInterval lists nothing.
func TestScraperModelsOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &replicaMux{metrics: serveFile(t, "vllm.txt"), list: modelList(1)}
		s := &Scraper{Client: &http.Client{Transport: handlerTransport{m}}, ModelsInterval: -1}
		s.Add("http://r")
		ctx, cancel := context.WithCancel(t.Context())
		go s.Run(ctx)
		time.Sleep(time.Minute) // synctest: advances the bubble's clock
		cancel()
		synctest.Wait()
		if got := m.hits.Load(); got != 0 {
			t.Errorf("got %d model requests, want 0", got)
		}
		if st, _ := s.Status("http://r"); st.Models != nil || st.Last.Running != 5 {
			t.Errorf("got %+v, want loads and no models", st)
		}
	})
}

// TestScraperModelsLive lists a real loopback vLLM-shaped server.
func TestScraperModelsLive(t *testing.T) {
	vllm, err := os.ReadFile(filepath.Join("testdata", "vllm-models.json"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(&replicaMux{metrics: serveFile(t, "vllm.txt"), list: string(vllm)})
	defer srv.Close()
	got := make(chan []Model, 1)
	s := &Scraper{
		Interval:       10 * time.Millisecond,
		ModelsInterval: 10 * time.Millisecond,
		OnModels: func(id string, ms []Model) {
			select {
			case got <- ms:
			default:
			}
		},
	}
	s.Add(srv.URL)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	var ms []Model
	select {
	case ms = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no model list within 10 s")
	}
	cancel()
	<-ran
	want := []Model{{ID: "Qwen/Qwen3-8B"}, {ID: "sql-lora", Parent: "Qwen/Qwen3-8B"}}
	if d := cmp.Diff(want, ms); d != "" {
		t.Errorf("models mismatch (-want +got):\n%s", d)
	}
}

// FuzzDecodeModels checks that any input either fails or yields a list
// within the limits.
func FuzzDecodeModels(f *testing.F) {
	vllm, err := os.ReadFile(filepath.Join("testdata", "vllm-models.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(vllm)
	f.Add([]byte(`{"data":[{"id":"a","parent":"b"}]}`))
	f.Add([]byte(`{"data":[],"x":{"y":[1,2,{"z":null}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := decodeModels(&limitReader{r: strings.NewReader(string(b)), max: MaxModelsBody, n: MaxModelsBody})
		if err != nil {
			return
		}
		if len(ms) > MaxModels {
			t.Errorf("got %d models, want at most %d", len(ms), MaxModels)
		}
		for _, m := range ms {
			if m.ID == "" || len(m.ID) > MaxModelID || len(m.Parent) > MaxModelID {
				t.Errorf("got model %+v outside the limits", m)
			}
		}
	})
}
