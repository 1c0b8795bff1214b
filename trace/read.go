package trace

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// maxLine is the longest Mooncake line accepted, in bytes (the real trace's
// longest is about 2 KB).
const maxLine = 16 << 20

// mooncakeLine is one line of a Mooncake trace, with the optional fields of
// a kvrouter recording (package record).
type mooncakeLine struct {
	StartUnixMs  *int64   `json:"start_unix_ms"`
	Timestamp    *float64 `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	BlockSize    int      `json:"block_size"`
	Session      string   `json:"session"`
	Estimated    bool     `json:"tokens_estimated"`
	// SLOClass, SLOTTFTMs and SLOITLMs are the request's own SLO class
	// and bounds (a kvrouter extension, as record writes a request's
	// X-SLO-TTFT-Ms / X-SLO-TPOT-Ms): absent bounds of a class are
	// derived.
	SLOClass  string   `json:"slo_class"`
	SLOTTFTMs *float64 `json:"slo_ttft_ms"`
	SLOITLMs  *float64 `json:"slo_itl_ms"`
}

// Bounds of a recording's fields.
const (
	maxBlockSize     = 1 << 16
	maxPromptTokens  = 1 << 30
	maxSessionBytes  = 256
	maxClassBytes    = 64
	maxSLOMs         = 1e9 // about 11 days
	maxStartUnixMs   = 1 << 50
	tailSegmentFlag  = 1 << 63
	tailSegmentShift = 40
)

// ReadMooncake streams the requests of a Mooncake trace (JSONL, one object a
// line: timestamp in ms from the trace start, input_length and
// output_length in tokens, hash_ids one per 512-token block of the prompt).
// Each hash id becomes a Segment of MooncakeBlock tokens, the last one
// holding the remainder input_length − 512×(n−1). Requests are named
// "mc-<line number>". Blank lines are skipped; on a malformed line the
// sequence yields an error naming the line and stops.
//
// A line may carry its request's own SLO class (Request.SLO): slo_class,
// slo_ttft_ms and slo_itl_ms, each optional.
//
// It also reads kvrouter recordings (kvrouter serve --record), whose lines
// add block_size, the tokens per hash id, and session, the request's
// session: then each hash id is a Segment of block_size tokens (they
// cover the prompt's full blocks), the rest of the prompt a segment of
// its own, unshared, and the prompt is the larger of input_length and the
// ids' cover (a text-mode router estimates tokens per block). A line's
// start_unix_ms (the first line of each recorded file has one) sets the
// wall time its timestamp and the next ones count from, so that arrival
// times run on from one recording to the next in the same file.
func ReadMooncake(r io.Reader) iter.Seq2[Request, error] {
	return readMooncake(r, 0, nil, nil)
}

// readMooncake is ReadMooncake with the file's number, which keeps the
// unshared tail segments of different files apart; it reports the first
// start_unix_ms read to origin and the requests whose block tokens are
// estimated to est (see calibrate), each nil to ignore.
func readMooncake(r io.Reader, file uint64, origin *int64, est *[]estimated) iter.Seq2[Request, error] {
	return func(yield func(Request, error) bool) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), maxLine)
		clk := mooncakeClock{file: file}
		line, n := 0, 0
		for sc.Scan() {
			line++
			b := sc.Bytes()
			if len(bytes.TrimSpace(b)) == 0 {
				continue
			}
			req, err := clk.parse(b, line)
			if err != nil {
				yield(Request{}, fmt.Errorf("mooncake line %d: %w", line, err))
				return
			}
			if origin != nil && clk.started {
				*origin = clk.origin
			}
			if est != nil && clk.estimated {
				*est = append(*est, estimated{at: n, input: clk.input})
			}
			n++
			if !yield(req, nil) {
				return
			}
		}
		if err := sc.Err(); err != nil {
			yield(Request{}, fmt.Errorf("mooncake line %d: %w", line+1, err))
		}
	}
}

// mooncakeClock follows a file's start_unix_ms: origin is the first read,
// epoch the last.
type mooncakeClock struct {
	file          uint64
	started       bool
	origin, epoch int64
	estimated     bool // the last line's block tokens are an estimate
	input         int  // the last line's input_length
}

func (c *mooncakeClock) parse(b []byte, line int) (Request, error) {
	var m mooncakeLine
	if err := json.Unmarshal(b, &m); err != nil {
		return Request{}, err
	}
	switch {
	case m.Timestamp == nil:
		return Request{}, errors.New("no timestamp")
	case !(*m.Timestamp >= 0 && *m.Timestamp < 1e15):
		return Request{}, fmt.Errorf("timestamp %v: want 0 to 1e15 ms", *m.Timestamp)
	case m.InputLength < 1 || m.InputLength > maxPromptTokens:
		return Request{}, fmt.Errorf("input_length %d: want 1 to %d", m.InputLength, maxPromptTokens)
	case m.OutputLength < 0 || m.OutputLength > maxPromptTokens:
		return Request{}, fmt.Errorf("output_length %d: want 0 to %d", m.OutputLength, maxPromptTokens)
	case m.StartUnixMs != nil && (*m.StartUnixMs < 0 || *m.StartUnixMs > maxStartUnixMs):
		return Request{}, fmt.Errorf("start_unix_ms %d out of range", *m.StartUnixMs)
	case m.BlockSize < 0 || m.BlockSize > maxBlockSize:
		return Request{}, fmt.Errorf("block_size %d: want 1 to %d", m.BlockSize, maxBlockSize)
	case len(m.Session) > maxSessionBytes:
		return Request{}, fmt.Errorf("session longer than %d bytes", maxSessionBytes)
	}
	slo, err := m.slo()
	if err != nil {
		return Request{}, err
	}
	if s := m.StartUnixMs; s != nil {
		if !c.started {
			c.started, c.origin = true, *s
		}
		c.epoch = *s
	}
	c.estimated, c.input = m.Estimated && m.BlockSize > 0, m.InputLength
	segs, prompt, err := c.segments(&m, line)
	if err != nil {
		return Request{}, err
	}
	at := float64(c.epoch-c.origin) + *m.Timestamp
	return Request{
		ID:       "mc-" + strconv.Itoa(line),
		At:       time.Duration(at * float64(time.Millisecond)),
		Session:  m.Session,
		Segments: segs,
		Prompt:   prompt,
		Output:   m.OutputLength,
		SLO:      slo,
		Recorded: m.BlockSize > 0,
	}, nil
}

// slo is the line's SLO class. Bounds without a class name make one
// named for them ("1000ms/50ms"), so that requests asking for the same
// bounds are reported together.
func (m *mooncakeLine) slo() (route.SLO, error) {
	var s route.SLO
	for _, b := range []struct {
		name string
		ms   *float64
		to   *time.Duration
	}{{"slo_ttft_ms", m.SLOTTFTMs, &s.TTFT}, {"slo_itl_ms", m.SLOITLMs, &s.ITL}} {
		if b.ms == nil {
			continue
		}
		if !(*b.ms > 0 && *b.ms <= maxSLOMs) {
			return s, fmt.Errorf("%s %v: want above 0 to %g", b.name, *b.ms, float64(maxSLOMs))
		}
		*b.to = time.Duration(*b.ms * float64(time.Millisecond))
	}
	if len(m.SLOClass) > maxClassBytes {
		return s, fmt.Errorf("slo_class longer than %d bytes", maxClassBytes)
	}
	s.Class = m.SLOClass
	if s.Class == "" && (s.TTFT > 0 || s.ITL > 0) {
		s.Class = fmt.Sprintf("%s/%s", bound(s.TTFT), bound(s.ITL))
	}
	return s, nil
}

// bound writes an SLO bound of a class name, "derived" when zero.
func bound(d time.Duration) string {
	if d == 0 {
		return "derived"
	}
	return d.String()
}

// segments turns a line's hash ids into the prompt's segments (see
// ReadMooncake) and returns them with the prompt's length.
func (c *mooncakeClock) segments(m *mooncakeLine, line int) ([]Segment, int, error) {
	n := len(m.HashIDs)
	if m.BlockSize == 0 { // Mooncake's own: the ids cover input_length exactly
		last := m.InputLength - MooncakeBlock*(n-1)
		if n == 0 || last < 1 || last > MooncakeBlock {
			return nil, 0, fmt.Errorf("%d hash_ids do not cover input_length %d in %d-token blocks", n, m.InputLength, MooncakeBlock)
		}
		segs := make([]Segment, n)
		for i, id := range m.HashIDs {
			segs[i] = Segment{ID: id, Tokens: MooncakeBlock}
		}
		segs[n-1].Tokens = last
		return segs, m.InputLength, nil
	}
	cover := n * m.BlockSize
	if cover > maxPromptTokens {
		return nil, 0, fmt.Errorf("%d hash_ids of %d tokens: more than %d tokens", n, m.BlockSize, maxPromptTokens)
	}
	segs := make([]Segment, n, n+1)
	for i, id := range m.HashIDs {
		if id&tailSegmentFlag != 0 {
			return nil, 0, fmt.Errorf("hash id %d: want below 2^63", id)
		}
		segs[i] = Segment{ID: id, Tokens: m.BlockSize}
	}
	if tail := m.InputLength - cover; tail > 0 {
		segs = append(segs, Segment{ID: tailSegmentFlag | c.file<<tailSegmentShift | uint64(line), Tokens: tail})
	}
	return segs, max(m.InputLength, cover), nil
}

// azureTime is the layout of the Azure trace's TIMESTAMP column.
const azureTime = "2006-01-02 15:04:05.999999999"

// ReadAzure streams the requests of an Azure LLM inference trace (CSV with
// header TIMESTAMP,ContextTokens,GeneratedTokens). Arrival times are
// relative to the first row. The trace has no prefix information: each
// prompt is one unique segment whose ID is the row number. Requests are
// named "az-<row>". On a malformed row the sequence yields an error naming
// the line and stops.
func ReadAzure(r io.Reader) iter.Seq2[Request, error] {
	return func(yield func(Request, error) bool) {
		cr := csv.NewReader(r)
		cr.FieldsPerRecord = 3
		cr.ReuseRecord = true
		head, err := cr.Read()
		if err != nil {
			yield(Request{}, fmt.Errorf("azure header: %w", err))
			return
		}
		if strings.TrimPrefix(head[0], "\ufeff") != "TIMESTAMP" || head[1] != "ContextTokens" || head[2] != "GeneratedTokens" {
			yield(Request{}, fmt.Errorf("azure header %q: want TIMESTAMP,ContextTokens,GeneratedTokens", head))
			return
		}
		var t0 time.Time
		for row := 1; ; row++ {
			rec, err := cr.Read()
			if err == io.EOF {
				return
			}
			if err != nil {
				yield(Request{}, fmt.Errorf("azure: %w", err))
				return
			}
			req, t, err := parseAzure(rec, row, t0)
			if err != nil {
				yield(Request{}, fmt.Errorf("azure line %d: %w", row+1, err))
				return
			}
			if row == 1 {
				t0, req.At = t, 0
			}
			if !yield(req, nil) {
				return
			}
		}
	}
}

func parseAzure(rec []string, row int, t0 time.Time) (Request, time.Time, error) {
	t, err := time.Parse(azureTime, strings.TrimSpace(rec[0]))
	if err != nil {
		return Request{}, t, err
	}
	in, err := strconv.Atoi(strings.TrimSpace(rec[1]))
	if err != nil || in < 1 {
		return Request{}, t, fmt.Errorf("ContextTokens %q: want a positive integer", rec[1])
	}
	out, err := strconv.Atoi(strings.TrimSpace(rec[2]))
	if err != nil || out < 0 {
		return Request{}, t, fmt.Errorf("GeneratedTokens %q: want an integer ≥ 0", rec[2])
	}
	at := t.Sub(t0)
	if t0.IsZero() {
		at = 0
	}
	return Request{
		ID:       "az-" + strconv.Itoa(row),
		At:       at,
		Segments: []Segment{{ID: uint64(row), Tokens: in}},
		Prompt:   in,
		Output:   out,
	}, t, nil
}

// Collect reads all of seq into a slice, stopping at the first error.
func Collect(seq iter.Seq2[Request, error]) ([]Request, error) {
	var reqs []Request
	for r, err := range seq {
		if err != nil {
			return reqs, err
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}
