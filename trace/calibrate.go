package trace

import "math"

// calibrate corrects the block tokens of the requests est names, whose
// hash ids stand for a text-mode router's estimate of tokens per block
// (tokens_estimated: characters / 4), against the engine's own prompt
// counts: over them all, the tokens per id are scaled by the ratio of
// the prompts' tokens to the ids' cover, so that ids keep one size
// throughout (equal ids, equal content) and cover the prompts as the
// engine counted them. Requests are rebuilt as ReadMooncake builds them
// (ids, then an unshared tail; the prompt the larger of its length and
// the ids' cover). A ratio within 2% of 1 changes nothing.
func calibrate(reqs []Request, est []estimated) {
	var prompt, cover float64
	for _, e := range est {
		if n, bs := ids(&reqs[e.at]); n > 0 {
			prompt += float64(e.input)
			cover += float64(n * bs)
		}
	}
	if cover == 0 || math.Abs(prompt/cover-1) < 0.02 {
		return
	}
	for _, e := range est {
		r := &reqs[e.at]
		n, bs := ids(r)
		if n == 0 {
			continue
		}
		nbs := max(int(math.Round(float64(bs)*prompt/cover)), 1)
		input, i := e.input, e.at
		segs := r.Segments[:n]
		for k := range segs {
			segs[k].Tokens = nbs
		}
		tail := r.Segments[len(r.Segments)-1]
		if rest := input - n*nbs; rest > 0 {
			tail.Tokens = rest
			if tail.ID&tailSegmentFlag == 0 { // no tail read: make one of the request's own
				tail.ID = tailSegmentFlag | uint64(i)<<1 | 1<<62
			}
			segs = append(segs, tail)
		}
		r.Segments, r.Prompt = segs, max(input, n*nbs)
	}
}

// estimated is a request whose block tokens are estimated: its index
// and its input_length.
type estimated struct{ at, input int }

// ids returns how many of r's leading segments are hash ids (not its
// unshared tail) and their tokens each.
func ids(r *Request) (n, tokens int) {
	for _, s := range r.Segments {
		if s.ID&tailSegmentFlag != 0 {
			break
		}
		n++
	}
	if n == 0 {
		return 0, 0
	}
	return n, r.Segments[0].Tokens
}
