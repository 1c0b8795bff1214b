package epp

import (
	"net/http"
	"strconv"

	"github.com/kvrouter/kvrouter/proxy"
)

// The picker holds each request's body until it routes it, as the HTTP
// router does, and takes the bytes from the router's budget of bodies
// held together (proxy.BodyBudget, --max-body-bytes-total): a request
// that declares a Content-Length takes it when its headers arrive, before
// any of its body, one without takes its chunks as they come, doubling
// what it holds as its buffer does. Past the bound the request gets an
// immediate 503 body_budget_exhausted with Retry-After. The bytes are
// given back when the stream ends.

// codeBodyBudget is the error code of a request refused for the budget.
const codeBodyBudget = "body_budget_exhausted"

// takeDeclared takes the body's declared length, if the headers declare
// one within MaxBodyBytes, and reports whether the stream goes on (else
// it answered: 413 past MaxBodyBytes, 503 past the budget).
func (st *stream) takeDeclared() (bool, error) {
	n, err := strconv.ParseInt(st.header.Get("Content-Length"), 10, 64)
	if err != nil || n <= 0 {
		return true, nil
	}
	if n > st.s.cfg.MaxBodyBytes {
		return false, st.tooLarge()
	}
	return st.take(n)
}

// takeChunk takes room for n more body bytes beyond what the stream holds.
func (st *stream) takeChunk(n int) (bool, error) {
	need := int64(len(st.body)+n) - st.held
	if need <= 0 {
		return true, nil
	}
	return st.take(max(need, st.held))
}

// take takes n bytes from the budget, or answers 503.
func (st *stream) take(n int64) (bool, error) {
	b := st.s.rt.BodyBudget()
	if !b.Take(n) {
		st.s.m.errors.WithLabelValues(codeBodyBudget).Inc()
		h := http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}}
		return false, st.immediate(http.StatusServiceUnavailable, h, errorBody(http.StatusServiceUnavailable, codeBodyBudget, proxy.BudgetMessage(b)), codeBodyBudget)
	}
	st.held += n
	return true, nil
}

// giveBody gives the stream's bytes back to the budget.
func (st *stream) giveBody() {
	st.s.rt.BodyBudget().Give(st.held)
	st.held = 0
}
