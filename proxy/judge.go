package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/kvrouter/kvrouter/sse"
)

// A replica that answers 200 with something other than a completion
// (another service on its port, a broken build, a hostile host) answers
// fast and so looks idle: every load-aware policy would prefer it. The
// router therefore judges a routed 200 by its content before the client
// gets any of it: a streamed request must get an event stream with a
// completion chunk before its end, any other a JSON object with a
// "choices" array. An answer that is neither is the replica's failure,
// as a 5xx is: passive health counts it (enough in a row eject the
// replica, health.Outlier), kvrouter_upstream_invalid_total counts it,
// and the request is retried on another replica; when none is left the
// client gets a 502 upstream_invalid_response instead of the answer.

// codeUpstreamInvalid is the error code of a 200 answer that is not the
// protocol, when no replica answered better.
const codeUpstreamInvalid = "upstream_invalid_response"

// Why an answer was judged invalid, the values of
// kvrouter_upstream_invalid_total's kind label.
const (
	invalidContentType = "content_type" // not text/event-stream for a stream, not JSON otherwise
	invalidNoChoices   = "no_choices"   // a JSON answer without a "choices" array
	invalidNoChunk     = "no_chunk"     // a stream that ended before any completion chunk
)

// invalidError is an answer that is not the protocol.
type invalidError struct{ kind, msg string }

func (e *invalidError) Error() string { return e.msg }

// invalid wraps a judgement as the attempt's failure: retried like a 5xx,
// reported with code upstream_invalid_response, counted by replica.
func (c *call) invalid(e *invalidError) error {
	c.rt.m.invalid.WithLabelValues(c.rt.name(c.replica), e.kind).Inc()
	return &upstreamError{code: codeUpstreamInvalid, err: e}
}

// judgeType checks the content type of a routed 200 answer: an event
// stream for a streamed request, JSON for any other. Other answers are
// not judged.
func (c *call) judgeType(resp *http.Response) *invalidError {
	if resp.StatusCode != http.StatusOK || !c.routed {
		return nil
	}
	want := "application/json"
	if c.prompt != nil && c.prompt.Stream {
		want = "text/event-stream"
	}
	ct := resp.Header.Get("Content-Type")
	if ct == want || ct == want+"; charset=utf-8" { // what engines send: parsing them would allocate
		return nil
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == want {
		return nil
	}
	return &invalidError{kind: invalidContentType,
		msg: fmt.Sprintf("the replica answered 200 with content type %q, not %s", ct, want)}
}

// judgeJSON checks that a non-streamed answer read whole (head, as
// readWhole left it) is a JSON object with a "choices" array, and gives
// a valid one's usage to tap in the same pass (sse.Tap.SetUsage). An
// answer larger than the retry buffer is not judged: its rest has not
// been read.
func judgeJSON(resp *http.Response, tap *sse.Tap) *invalidError {
	b, ok := resp.Body.(*buffered)
	if !ok || b.rest != nil {
		return nil
	}
	var a struct {
		Choices choicesArray `json:"choices"`
		Usage   *sse.Usage   `json:"usage"`
		Model   string       `json:"model"`
		ID      string       `json:"id"`
	}
	if err := json.Unmarshal(b.head, &a); err != nil {
		return &invalidError{kind: invalidNoChoices, msg: "the replica answered 200 with a body that is not a JSON object: " + err.Error()}
	}
	if !a.Choices {
		return &invalidError{kind: invalidNoChoices, msg: "the replica answered 200 without a \"choices\" array"}
	}
	tap.SetUsage(a.Usage, a.Model, a.ID)
	return nil
}

// choicesArray notes whether a JSON value is an array, without keeping
// it.
type choicesArray bool

// UnmarshalJSON implements json.Unmarshaler.
func (a *choicesArray) UnmarshalJSON(b []byte) error {
	*a = len(b) > 0 && b[0] == '['
	return nil
}

// judgeStream checks a stream that read ahead to its first token or its
// end: one that ended ([DONE]) without a completion chunk (no text, no
// chunk id) gave the client nothing.
func judgeStream(s *stream) *invalidError {
	if s.sp.Ended && s.sp.Tokens == 0 && s.sp.ID == "" {
		return &invalidError{kind: invalidNoChunk, msg: "the replica's stream ended before any completion chunk"}
	}
	return nil
}

// isInvalid reports whether err is an answer judged not the protocol.
func isInvalid(err error) bool {
	var e *invalidError
	return errors.As(err, &e)
}

// upstreamResponse is an OpenAI-shaped answer of the router's own in place
// of an upstream's (status, code and message), as the retrier returns it
// after its last attempt.
func upstreamResponse(req *http.Request, status int, code, msg string) *http.Response {
	b := errorBody(errUpstream, code, "", msg)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)), Request: req,
	}
}
