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
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// maxLine is the longest Mooncake line accepted, in bytes (the real trace's
// longest is about 2 KB).
const maxLine = 16 << 20

// mooncakeLine is one line of a Mooncake trace.
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// ReadMooncake streams the requests of a Mooncake trace (JSONL, one object a
// line: timestamp in ms from the trace start, input_length and
// output_length in tokens, hash_ids one per 512-token block of the prompt).
// Each hash id becomes a Segment of MooncakeBlock tokens, the last one
// holding the remainder input_length − 512×(n−1). Requests are named
// "mc-<line number>". Blank lines are skipped; on a malformed line the
// sequence yields an error naming the line and stops.
func ReadMooncake(r io.Reader) iter.Seq2[Request, error] {
	return func(yield func(Request, error) bool) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), maxLine)
		line := 0
		for sc.Scan() {
			line++
			b := sc.Bytes()
			if len(bytes.TrimSpace(b)) == 0 {
				continue
			}
			req, err := parseMooncake(b, line)
			if err != nil {
				yield(Request{}, fmt.Errorf("mooncake line %d: %w", line, err))
				return
			}
			if !yield(req, nil) {
				return
			}
		}
		if err := sc.Err(); err != nil {
			yield(Request{}, fmt.Errorf("mooncake line %d: %w", line+1, err))
		}
	}
}

func parseMooncake(b []byte, line int) (Request, error) {
	var m mooncakeLine
	if err := json.Unmarshal(b, &m); err != nil {
		return Request{}, err
	}
	switch {
	case m.Timestamp == nil:
		return Request{}, errors.New("no timestamp")
	case *m.Timestamp < 0:
		return Request{}, fmt.Errorf("negative timestamp %v", *m.Timestamp)
	case m.InputLength < 1:
		return Request{}, fmt.Errorf("input_length %d < 1", m.InputLength)
	case m.OutputLength < 0:
		return Request{}, fmt.Errorf("output_length %d < 0", m.OutputLength)
	}
	n := len(m.HashIDs)
	last := m.InputLength - MooncakeBlock*(n-1)
	if n == 0 || last < 1 || last > MooncakeBlock {
		return Request{}, fmt.Errorf("%d hash_ids do not cover input_length %d in %d-token blocks", n, m.InputLength, MooncakeBlock)
	}
	segs := make([]Segment, n)
	for i, id := range m.HashIDs {
		segs[i] = Segment{ID: id, Tokens: MooncakeBlock}
	}
	segs[n-1].Tokens = last
	return Request{
		ID:       "mc-" + strconv.Itoa(line),
		At:       time.Duration(*m.Timestamp * float64(time.Millisecond)),
		Segments: segs,
		Prompt:   m.InputLength,
		Output:   m.OutputLength,
	}, nil
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

// ReadFile reads a whole trace file: Mooncake JSONL for names ending in
// .jsonl or .json, Azure CSV for .csv. Requests are sorted by arrival
// (stably), as the simulator needs.
func ReadFile(path string) (*Workload, error) {
	read := ReadMooncake
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".jsonl", ".json":
	case ".csv":
		read = ReadAzure
	default:
		return nil, fmt.Errorf("trace %s: unknown format %q (want .jsonl or .csv)", path, ext)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	seq := read(bufio.NewReaderSize(f, 1<<20))
	reqs, err := Collect(seq)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	sortByArrival(reqs)
	name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return &Workload{Name: name, Requests: reqs}, nil
}
