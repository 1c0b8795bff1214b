package proxy

import (
	"io"
	"net/http"
	"sync"

	"kvrouter/fleet"
)

// retrier is the ReverseProxy's transport. It sends the request to the
// call's replica and, while no response byte has reached the client (which
// is always the case inside RoundTrip), retries on another replica after a
// connection error or a 5xx answer (500 included: some engines answer it
// when their KV cache is full): it marks the failure (passive health),
// releases the replica, re-picks with the failed replicas excluded and
// replays the body through GetBody. It never retries after the client went
// away.
type retrier struct{ rt *Router }

// RoundTrip implements http.RoundTripper.
func (t retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	rt := t.rt
	c := callFrom(req.Context())
	for attempt := 0; ; attempt++ {
		resp, err := rt.upstream.RoundTrip(req)
		if c == nil || !retryable(resp, err) || req.Context().Err() != nil || attempt >= rt.cfg.Retries || !replayable(req) {
			return resp, err
		}
		failed := c.replica
		rt.st.reportFailure(failed)
		rt.m.retries.WithLabelValues(rt.names[failed]).Inc()
		rt.log.Info("retrying on another replica", "id", c.id, "failed", rt.names[failed], "err", errString(resp, err))
		c.failed = append(c.failed, failed)
		c.ticket.Done(rt.now(), fleet.NoUsage, errRetried)
		c.ticket = nil
		if !c.repick() {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		next := req.Clone(req.Context())
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, gerr
			}
			next.Body = body
		}
		u := *rt.urls[c.replica]
		u.Path, u.RawPath, u.RawQuery = req.URL.Path, req.URL.RawPath, req.URL.RawQuery
		next.URL = &u
		next.Host = ""
		req = next
	}
}

// repick chooses another replica for a call whose replica failed. For a
// routed call it runs the policy again; for a pass-through it takes any
// other healthy replica.
func (c *call) repick() bool {
	if c.routed {
		return c.pick(nil)
	}
	return c.passTo(c.rt.anyHealthy(c.failed))
}

// retryable reports whether an attempt failed before the replica started
// answering: a transport error, or 500, 502, 503 or 504. Other statuses
// (a 4xx about the request, 501 and above 504) would repeat anywhere.
func retryable(resp *http.Response, err error) bool {
	if err != nil {
		return true
	}
	switch resp.StatusCode {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func errString(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.GetBody != nil || req.Body == nil || req.Body == http.NoBody
}

// copyBufSize is the size of the buffers ReverseProxy copies response
// bodies through (its own default).
const copyBufSize = 32 << 10

// bufferPool is ReverseProxy's BufferPool: without one it allocates a
// 32 KiB buffer per response. Buffers travel as array pointers so that
// Get and Put allocate nothing.
type bufferPool struct{ p sync.Pool }

// Get returns a copyBufSize buffer.
func (b *bufferPool) Get() []byte {
	if a, ok := b.p.Get().(*[copyBufSize]byte); ok {
		return a[:]
	}
	return new([copyBufSize]byte)[:]
}

// Put returns a buffer Get gave out; others are dropped.
func (b *bufferPool) Put(buf []byte) {
	if len(buf) == copyBufSize {
		b.p.Put((*[copyBufSize]byte)(buf))
	}
}
