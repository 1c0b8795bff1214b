package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// stallBody opens a connection to url and sends a completion request
// declaring n body bytes followed by n-1 of them, then stalls. The
// router's answer, when it comes, is sent on answers.
func stallBody(t *testing.T, url string, n int, answers chan<- *http.Response) net.Conn {
	t.Helper()
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", n)
	c, br := rawRequest(t, url, head)
	go c.Write([]byte(strings.Repeat(" ", n-1))) // fails once the router refused and closed: that is fine
	go func() {
		if resp, err := http.ReadResponse(br, nil); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body = io.NopCloser(strings.NewReader(string(b)))
			answers <- resp
		}
	}()
	return c
}

// TestBodyBudget: 10 connections that each send all but the last byte of
// a 1 MiB body and stall, under a 4 MiB budget: 4 are held (the budget's
// held bytes are its bound, never more), the 6 others are answered 503
// body_budget_exhausted with Retry-After at once, before their body is
// read, and counted; while the bound is held a small request, and a
// chunked one, are refused too. Once the stalled clients go, the budget
// is free again and requests are served.
func TestBodyBudget(t *testing.T) {
	const mib = 1 << 20
	up := newFake(t, 0)
	rt, url, admin := serveLimited(t, func(c *Config) {
		c.MaxBodyBytes, c.MaxBodyBytesTotal = mib, 4*mib
		c.BodyTimeout = time.Hour // the held bodies wait for the test to close them
	}, up.URL)
	runRouter(t, rt)

	answers := make(chan *http.Response, 10)
	var conns []net.Conn
	for range 10 {
		conns = append(conns, stallBody(t, url, mib, answers))
	}
	wait.For(t, "4 bodies held and 6 refused", func() bool {
		return rt.budget.Held() == 4*mib && rt.budget.Refused() == 6
	})
	for range 6 {
		resp := <-answers
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || errorCode(string(b)) != codeBodyBudget || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("a body past the budget: got %d %s (Retry-After %q), want 503 %s with Retry-After 1", resp.StatusCode, b, resp.Header.Get("Retry-After"), codeBodyBudget)
		}
	}

	small := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	if resp, body := do(t, "POST", url+"/v1/chat/completions", small); resp.StatusCode != http.StatusServiceUnavailable || errorCode(body) != codeBodyBudget {
		t.Errorf("a small request at the bound: got %d %s, want 503 %s", resp.StatusCode, body, codeBodyBudget)
	}
	chunked, err := http.NewRequest("POST", url+"/v1/chat/completions", io.MultiReader(strings.NewReader(small)))
	if err != nil {
		t.Fatal(err)
	}
	chunked.ContentLength = -1 // sent chunked: counted as it is read
	if resp, err := http.DefaultClient.Do(chunked); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a chunked request at the bound: got %v %v, want 503", resp, err)
	} else {
		resp.Body.Close()
	}
	if got := metricValue(t, admin, "kvrouter_body_bytes_held"); got != 4*mib {
		t.Errorf("kvrouter_body_bytes_held = %v, want the bound %d", got, 4*mib)
	}
	if got := metricValue(t, admin, "kvrouter_body_budget_refused_total"); got != 8 {
		t.Errorf("kvrouter_body_budget_refused_total = %v, want 8", got)
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", codeBodyBudget); got != 8 {
		t.Errorf("kvrouter_errors_total{code=%s} = %v, want 8", codeBodyBudget, got)
	}

	select {
	case resp := <-answers:
		t.Errorf("a held body was answered %d, want it waiting for its last byte", resp.StatusCode)
	default:
	}
	for _, c := range conns {
		c.Close()
	}
	wait.For(t, "the stalled bodies given back", func() bool { return rt.budget.Held() == 0 })
	if resp, body := do(t, "POST", url+"/v1/chat/completions", small); resp.StatusCode != http.StatusOK {
		t.Errorf("after the stalled clients left: got %d %s, want 200", resp.StatusCode, body)
	}
}
