package emulator

import (
	"encoding/json"
	"errors"
	"strings"
)

// Stop sequences, as vLLM applies them: the output ends with the token
// that completes the first stop string found, the text is cut just before
// that string (it is not returned), and the finish reason is "stop". The
// emulator's output is its filler text, known in advance, so the cut is
// found when the request arrives.

// maxStops bounds the stop strings of a request, maxStopBytes each one.
const (
	maxStops     = 16
	maxStopBytes = 1024
)

// stopList is the "stop" field: a string, an array of strings, or null.
type stopList []string

// UnmarshalJSON accepts a string or an array of strings.
func (l *stopList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("stop must be a string or an array of strings")
	}
	*l = many
	return nil
}

// applyStop limits j to the tokens up to its first stop string and sets
// the byte length of the text kept (j.cut, with j.stopped); it fails on too many or too
// long stop strings.
func applyStop(j *job, stops stopList) error {
	if len(stops) > maxStops {
		return badRequest("stop: at most %d strings, got %d", maxStops, len(stops))
	}
	for _, s := range stops {
		if s == "" || len(s) > maxStopBytes {
			return badRequest("stop: each string must be 1 to %d bytes", maxStopBytes)
		}
	}
	if len(stops) == 0 {
		return nil
	}
	text := filler(j.offset, j.offset+j.max, j.chat)
	at := -1
	end := 0
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at, end = i, i+len(s)
		}
	}
	if at < 0 {
		return nil
	}
	n := 0 // tokens up to the one that completes the stop string
	for k := 0; n < end; k++ {
		n += len(fillerWord(j.offset+k, j.chat))
		j.max = k + 1
	}
	j.cut, j.stopped = at, true
	return nil
}

// clip cuts the text of output token i (word, starting at byte from of
// the output) to j.cut.
func (j *job) clip(word string, from int) string {
	if !j.stopped {
		return word
	}
	switch {
	case from >= j.cut:
		return ""
	case from+len(word) > j.cut:
		return word[:j.cut-from]
	}
	return word
}
