package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// What clients of the upstream-fault tests see: streams read event by
// event, replies asked of an engine directly, the router's /metrics.

// streamResult is what one client saw of a streamed chat completion.
type streamResult struct {
	replica  string // X-Kvrouter-Replica
	status   int    // HTTP status
	text     string // the content deltas, concatenated
	roles    int    // chunks carrying the assistant role
	ids      map[string]bool
	done     bool          // ended with [DONE]
	errCode  string        // code of a final error event, "" without
	err      error         // a transport error reading it: a silent end
	maxGap   time.Duration // longest wait between two events
	events   int
	firstTok chan struct{} // closed once a content delta arrived
}

// streamChat sends a streamed chat completion to the router and reads it
// to its end into res.
func streamChat(ctx context.Context, t *testing.T, url string, body []byte, res *streamResult) {
	res.ids = map[string]bool{}
	resp, err := post(ctx, t, url, "/v1/chat/completions", body)
	if err != nil {
		res.err = err
		close(res.firstTok)
		return
	}
	defer resp.Body.Close()
	res.status, res.replica = resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		res.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		close(res.firstTok)
		return
	}
	sc := bufio.NewScanner(resp.Body)
	last, first := time.Now(), false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		now := time.Now()
		res.maxGap, last = max(res.maxGap, now.Sub(last)), now
		res.events++
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(data), &c) != nil {
			continue
		}
		if c.Error != nil {
			res.errCode = c.Error.Code
			continue
		}
		res.ids[c.ID] = true
		for _, ch := range c.Choices {
			if ch.Delta.Role == "assistant" {
				res.roles++
			}
			res.text += ch.Delta.Content
			if ch.Delta.Content != "" && !first {
				first = true
				close(res.firstTok)
			}
		}
	}
	res.err = sc.Err()
	if !first {
		close(res.firstTok)
	}
}

// startStreams starts n streamed chats of maxTokens tokens (distinct
// prompts) and returns their results, filled in as they run, and a wait
// function for their ends.
func startStreams(t *testing.T, url string, n, maxTokens int) ([]*streamResult, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	res := make([]*streamResult, n)
	var wg sync.WaitGroup
	for i := range res {
		res[i] = &streamResult{firstTok: make(chan struct{})}
		body := fmt.Appendf(nil, `{"model":"emulated","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"story number %d, please"}]}`, maxTokens, i)
		wg.Go(func() { streamChat(ctx, t, url, body, res[i]) })
	}
	return res, func() { wg.Wait(); cancel() }
}

// wholeText asks an engine directly for the reply, not streamed: the text
// a stream must end up with, neither cut nor duplicated.
func wholeText(t *testing.T, engine string, maxTokens int) string {
	t.Helper()
	body := fmt.Appendf(nil, `{"model":"emulated","max_tokens":%d,"messages":[{"role":"user","content":"any"}]}`, maxTokens)
	resp, err := post(context.Background(), t, engine, "/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("reply from %s: %v", engine, err)
	}
	return r.Choices[0].Message.Content
}

// metricSum sums the samples of name in the Prometheus text at
// url+"/metrics" whose labels contain every one of labels (e.g.
// `replica="http://..."`); zero when there are none.
func metricSum(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
	for line := range strings.Lines(metricsText(t, url)) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(rest, l)
		}
		if !all {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) > 0 {
			v, _ := strconv.ParseFloat(f[0], 64)
			sum += v
		}
	}
	return sum
}

// waitFirstTokens waits until every stream had a token (or ended).
func waitFirstTokens(t *testing.T, res []*streamResult) {
	t.Helper()
	for _, r := range res {
		select {
		case <-r.firstTok:
		case <-time.After(20 * time.Second):
			t.Fatal("a stream had no token within 20 s")
		}
	}
}

// busiest returns the engine most of the streams are on, and how many.
func busiest(engines []*proc, res []*streamResult) (*proc, int) {
	var best *proc
	most := 0
	for _, e := range engines {
		n := 0
		for _, r := range res {
			if r.replica == e.URL() {
				n++
			}
		}
		if n > most {
			best, most = e, n
		}
	}
	return best, most
}

// checkStreams asserts what each client saw: the whole reply, neither cut
// nor duplicated, as one stream ending in [DONE], or a final error event;
// never a silent end. It returns how many were continued to [DONE].
func checkStreams(t *testing.T, res []*streamResult, want string) (done, errored int) {
	t.Helper()
	for i, r := range res {
		switch {
		case r.err != nil:
			t.Errorf("stream %d (on %s) ended silently: %v, text %q", i, r.replica, r.err, r.text)
		case r.done && r.errCode == "":
			done++
			if r.text != want || r.roles != 1 || len(r.ids) != 1 {
				t.Errorf("stream %d (on %s): text %q, %d role chunks, ids %v; want %q, 1, one id", i, r.replica, r.text, r.roles, r.ids, want)
			}
		case r.errCode != "" && !r.done:
			errored++
			if !strings.HasPrefix(want, r.text) {
				t.Errorf("stream %d (on %s) ended with error %s after text %q, not a prefix of the reply", i, r.replica, r.errCode, r.text)
			}
		default:
			t.Errorf("stream %d (on %s) ended with neither [DONE] nor an error event (done %v, error %q): a silent end", i, r.replica, r.done, r.errCode)
		}
	}
	return done, errored
}
