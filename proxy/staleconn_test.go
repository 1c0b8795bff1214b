package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// connPosts counts the completions served on one connection.
type connPosts struct{ n atomic.Int32 }

type connPostsKey struct{}

// TestKeptAliveConnectionClosedIsRetried: a replica that closes a
// kept-alive connection when the next request arrives on it, before
// answering (llama-server's keep-alive ending as the router reuses the
// connection), does not fail the request: the transport sends it again
// on a fresh connection to the same replica, and no retry on another
// replica is needed. The fleet has one replica, so a failed attempt
// would be a 502.
func TestKeptAliveConnectionClosedIsRetried(t *testing.T) {
	f := &fakeUpstream{}
	var closed atomic.Int32
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			if c := r.Context().Value(connPostsKey{}).(*connPosts); c.n.Add(1) > 1 {
				// The whole request is read first, so that the router's
				// write of it cannot meet the close.
				io.Copy(io.Discard, r.Body)
				closed.Add(1)
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close() // read, never answered
				}
				return
			}
		}
		f.serve(w, r)
	}))
	f.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connPostsKey{}, &connPosts{})
	}
	f.Start()
	t.Cleanup(f.Close)
	_, url := startRouter(t, "round-robin", nil, f.URL)
	for i := range 4 {
		resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
	}
	if closed.Load() == 0 {
		t.Fatal("the replica never closed a kept-alive connection under a request: the test tests nothing")
	}
	if n := metricValue(t, url, "kvrouter_retries_total"); n != 0 {
		t.Errorf("kvrouter_retries_total = %v, want 0 (the same replica served the request again)", n)
	}
}
