package trace

import (
	"bufio"
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

// maxFiles bounds the files one trace is read from.
const maxFiles = 1 << 16

// ReadFile reads a whole trace file: Mooncake JSONL (and kvrouter
// recordings) for names ending in .jsonl or .json, Azure CSV for .csv,
// each possibly followed by a rotation's number (rec.jsonl.1). Requests
// are sorted by arrival (stably), as the simulator needs.
func ReadFile(path string) (*Workload, error) { return ReadFiles(path) }

// ReadFiles reads several trace files as one trace in time order, as a
// router fleet's recordings (one per router, each with its rotated
// files): arrival times of recordings are aligned on their
// start_unix_ms, those of other files each count from their own start;
// requests are then sorted by arrival (stably, file by file on ties).
// The workload is named after the first file.
func ReadFiles(paths ...string) (*Workload, error) {
	if len(paths) == 0 {
		return nil, errors.New("trace: no file")
	}
	if len(paths) > maxFiles {
		return nil, fmt.Errorf("trace: %d files, at most %d", len(paths), maxFiles)
	}
	var all []Request
	origins := make([]int64, len(paths))
	counts := make([]int, len(paths))
	first := int64(-1)
	var est []estimated
	for i, p := range paths {
		origins[i] = -1
		reqs, err := readOne(p, uint64(i), &origins[i], &est, len(all))
		if err != nil {
			return nil, err
		}
		if len(paths) > 1 {
			for k := range reqs {
				reqs[k].ID = strconv.Itoa(i+1) + ":" + reqs[k].ID
			}
		}
		if o := origins[i]; o >= 0 && (first < 0 || o < first) {
			first = o
		}
		counts[i] = len(reqs)
		all = append(all, reqs...)
	}
	at := 0
	for i, n := range counts {
		if o := origins[i]; o >= 0 && first >= 0 {
			shift := time.Duration(o-first) * time.Millisecond
			for k := at; k < at+n; k++ {
				all[k].At += shift
			}
		}
		at += n
	}
	calibrate(all, est)
	sortByArrival(all)
	name := filepath.Base(paths[0])
	name = strings.TrimSuffix(name, filepath.Ext(name))
	if base, ext, ok := rotated(paths[0]); ok && ext != "" {
		name = strings.TrimSuffix(filepath.Base(base), ext)
	}
	return &Workload{Name: name, Requests: all}, nil
}

// readOne reads one file, reporting a recording's first start_unix_ms
// to origin and its requests of estimated block tokens to est, their
// indexes offset by at.
func readOne(path string, file uint64, origin *int64, est *[]estimated, at int) ([]Request, error) {
	var read func(io.Reader) iter.Seq2[Request, error]
	_, ext, _ := rotated(path)
	switch ext {
	case ".jsonl", ".json":
		var mine []estimated
		defer func() {
			for _, e := range mine {
				*est = append(*est, estimated{at: e.at + at, input: e.input})
			}
		}()
		read = func(r io.Reader) iter.Seq2[Request, error] { return readMooncake(r, file, origin, &mine) }
	case ".csv":
		read = ReadAzure
	default:
		return nil, fmt.Errorf("trace %s: unknown format %q (want .jsonl or .csv)", path, filepath.Ext(path))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	reqs, err := Collect(read(bufio.NewReaderSize(f, 1<<20)))
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

// rotated splits a rotated file's number off path ("rec.jsonl.2" gives
// "rec.jsonl") and returns the rest with its extension, lower case; ok
// says a number was there.
func rotated(path string) (base, ext string, ok bool) {
	base = path
	if e := filepath.Ext(path); len(e) > 1 {
		if _, err := strconv.Atoi(e[1:]); err == nil {
			base, ok = strings.TrimSuffix(path, e), true
		}
	}
	return base, strings.ToLower(filepath.Ext(base)), ok
}

// Expand turns a --trace argument into files: a comma-separated list of
// paths, each possibly a glob pattern (rec.jsonl* takes a recording and
// its rotated files). A pattern that matches nothing is an error, as is a
// file that does not exist.
func Expand(spec string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(spec, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !strings.ContainsAny(p, "*?[") {
			out = append(out, p)
			continue
		}
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, fmt.Errorf("trace %q: %w", p, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("trace %q: no file matches", p)
		}
		out = append(out, m...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace %q: no file", spec)
	}
	return out, nil
}
