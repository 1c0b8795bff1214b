package epp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// maxAnswerBytes bounds the router's answer kept for an immediate
// response (its errors are a few hundred bytes).
const maxAnswerBytes = 64 << 10

// answer is the http.ResponseWriter the router answers a request it does
// not route into: its status, headers and body become Envoy's immediate
// response.
type answer struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

// Header implements http.ResponseWriter.
func (a *answer) Header() http.Header {
	if a.h == nil {
		a.h = http.Header{}
	}
	return a.h
}

// WriteHeader implements http.ResponseWriter.
func (a *answer) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
}

// Write implements http.ResponseWriter, keeping at most maxAnswerBytes.
func (a *answer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	if room := maxAnswerBytes - a.body.Len(); room > 0 {
		a.body.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// code is the answer's status; 500 when the router wrote none (it always
// does).
func (a *answer) code() int {
	if a.status == 0 {
		return http.StatusInternalServerError
	}
	return a.status
}

// errorBody is an OpenAI-style error, as the HTTP router writes them.
func errorBody(status int, code, msg string) []byte {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "service_unavailable"
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, code
	b, _ := json.Marshal(&e)
	return append(b, '\n')
}

// httpStatus is code as Envoy's HttpStatus (its enum values are the HTTP
// codes).
func httpStatus(code int) *typev3.HttpStatus {
	return &typev3.HttpStatus{Code: typev3.StatusCode(code)}
}

// setHeader sets key (lower-cased, as Envoy wants header names) to
// value, replacing any value the message had.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: strings.ToLower(key), RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// metadata is the dynamic metadata naming the picked endpoint:
// {namespace: {key: endpoint}}.
func metadata(namespace, key, endpoint string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		namespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			key: structpb.NewStringValue(endpoint),
		}}),
	}}
}

// subsetOf returns the endpoints Envoy allows the picker to choose from
// (filter metadata namespace+".subset_hint", key SubsetKey), or nil when
// it sets none. The value comes in the forms GIE's reference picker
// accepts: a list of strings (what a control plane writes), one string
// (what Envoy's header-to-metadata filter makes of a header), and a list
// element holding several; each is comma-separated, and an entry is
// "host:port" (that endpoint) or a bare host (every port of that pod).
// Entries that are not strings are ignored. A key present with no entry
// allows none.
func subsetOf(req *extprocv3.ProcessingRequest, namespace string) []string {
	md := req.GetMetadataContext().GetFilterMetadata()[namespace+".subset_hint"]
	v, ok := md.GetFields()[SubsetKey]
	if !ok {
		return nil
	}
	out := []string{}
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
		return appendEndpoints(out, s.StringValue)
	}
	for _, e := range v.GetListValue().GetValues() {
		out = appendEndpoints(out, e.GetStringValue())
	}
	return out
}

// appendEndpoints appends the comma-separated endpoints of s to dst,
// spaces trimmed, a bracketed bare IPv6 address ("[fd00::1]") without
// its brackets.
func appendEndpoints(dst []string, s string) []string {
	for e := range strings.SplitSeq(s, ",") {
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
			e = e[1 : len(e)-1]
		}
		if e != "" {
			dst = append(dst, e)
		}
	}
	return dst
}
