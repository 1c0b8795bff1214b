package report

import (
	"math"
	"slices"
	"time"
)

// Options parameterises Summarize. The zero value works.
type Options struct {
	// Policy names the result.
	Policy string
	// SLO is goodput's objective; zero fields take their defaults.
	SLO SLO
	// Replicas is the fleet size; zero means one more than the largest
	// Sample.Replica.
	Replicas int
	// Buckets is the number of load buckets over the run; zero means 120.
	Buckets int
	// CDFPoints caps the TTFT CDF; zero means 200.
	CDFPoints int
	// NoPrediction says the policy predicts no cached tokens (see
	// Result.NoPrediction); false means the samples' PredictedCached are
	// its predictions.
	NoPrediction bool
}

// Summarize turns one policy's samples into its Result. Latency
// percentiles are nearest-rank (see Dist) over completed requests.
// Per-replica load counts a request in flight on its replica from its
// arrival to its end (At to At+E2E), rejected requests not at all.
func Summarize(samples []Sample, opt Options) Result {
	slo := opt.SLO.orDefault()
	res := Result{Policy: opt.Policy, Requests: len(samples), Reasons: map[string]int{}, NoPrediction: opt.NoPrediction}
	var ttft, e2e, itl []time.Duration
	var predicted int64
	met := 0
	replicas := opt.Replicas
	start, end := time.Duration(math.MaxInt64), time.Duration(0)
	for _, s := range samples {
		start = min(start, s.At)
		end = max(end, s.At+s.E2E)
		replicas = max(replicas, s.Replica+1)
		if s.Reason != "" {
			res.Reasons[s.Reason]++
		}
		if s.SLOQueued {
			res.SLOQueued++
		}
		switch {
		case s.OK:
			res.Completed++
		case s.Rejected:
			res.Rejected++
			continue
		default:
			res.Errors++
			continue
		}
		ttft, e2e = append(ttft, s.TTFT), append(e2e, s.E2E)
		if s.Output > 1 {
			itl = append(itl, s.ITL)
		}
		res.PromptTokens += int64(s.Prompt)
		res.CachedTokens += int64(s.Cached)
		res.OutputTokens += int64(s.Output)
		predicted += int64(s.PredictedCached)
		if s.meets(slo) {
			met++
		}
	}
	if len(samples) == 0 {
		start = 0
	}
	res.TTFT, res.E2E, res.ITL = dist(ttft), dist(e2e), dist(itl)
	res.PrefillTokens = res.PromptTokens - res.CachedTokens
	res.HitRate = ratio(float64(res.CachedTokens), float64(res.PromptTokens))
	res.PredictedHitRate = ratio(float64(predicted), float64(res.PromptTokens))
	span := end - start
	res.Duration = Millis(span)
	res.Throughput = ratio(float64(res.OutputTokens), span.Seconds())
	res.Goodput = ratio(float64(met), span.Seconds())
	res.SLOMet = ratio(float64(met), float64(len(samples)))
	res.PerReplica = make([]int, replicas)
	for _, s := range samples {
		if s.Replica >= 0 && !s.Rejected {
			res.PerReplica[s.Replica]++
		}
	}
	res.Classes = classResults(samples)
	res.MaxLoad, res.MeanLoad, res.PeakLoad = balance(samples, replicas, start, end)
	res.Series.TTFT = cdf(ttft, or(opt.CDFPoints, 200))
	res.Series.Bucket, res.Series.Load = loadSeries(samples, replicas, start, end, or(opt.Buckets, 120))
	return res
}

func or(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// dist sorts ds and returns its nearest-rank percentiles and mean.
func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	slices.Sort(ds)
	var sum float64
	for _, d := range ds {
		sum += float64(d)
	}
	return Dist{
		P50:  Millis(Percentile(ds, 50)),
		P90:  Millis(Percentile(ds, 90)),
		P99:  Millis(Percentile(ds, 99)),
		Mean: Millis(time.Duration(math.Round(sum / float64(len(ds))))),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted: element ⌈p·n/100⌉ (1-based); zero for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	k := int(math.Ceil(p * float64(n) / 100))
	return sorted[min(max(k, 1), n)-1]
}

// cdf returns at most points points of the CDF of sorted durations, in
// milliseconds; the last point is always the maximum.
func cdf(sorted []time.Duration, points int) []Point {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	k := min(n, points)
	out := make([]Point, 0, k)
	for i := 1; i <= k; i++ {
		j := int(math.Ceil(float64(i)*float64(n)/float64(k))) - 1
		out = append(out, Point{X: round6(float64(sorted[j]) / 1e6), Y: round6(float64(j+1) / float64(n))})
	}
	return out
}

// edge is a request entering (+1) or leaving (−1) a replica at a time.
type edge struct {
	at    time.Duration
	rep   int
	delta int
}

// balance sweeps the placed requests' in-flight intervals and returns the
// time-averaged in-flight count of the busiest replica and of the mean
// replica, and the peak count on any replica.
func balance(samples []Sample, replicas int, start, end time.Duration) (maxLoad, meanLoad float64, peak int) {
	span := float64(end - start)
	if replicas == 0 || span <= 0 {
		return 0, 0, 0
	}
	var edges []edge
	for _, s := range samples {
		if s.Replica >= 0 && !s.Rejected {
			edges = append(edges, edge{s.At, s.Replica, 1}, edge{s.At + s.E2E, s.Replica, -1})
		}
	}
	// Leaves sort before arrivals at the same instant.
	slices.SortFunc(edges, func(a, b edge) int {
		if a.at != b.at {
			return int(max(min(a.at-b.at, 1), -1))
		}
		return a.delta - b.delta
	})
	cur := make([]int, replicas)
	var maxArea, total float64
	busiest, inFlight := 0, 0
	last := start
	for _, e := range edges {
		dt := float64(e.at - last)
		maxArea += dt * float64(busiest)
		total += dt * float64(inFlight)
		last = e.at
		cur[e.rep] += e.delta
		inFlight += e.delta
		if e.delta > 0 {
			busiest = max(busiest, cur[e.rep])
			peak = max(peak, cur[e.rep])
		} else {
			busiest = slices.Max(cur)
		}
	}
	return maxArea / span, total / span / float64(replicas), peak
}

// loadSeries returns the bucket width and, per replica and bucket, the
// time-averaged in-flight requests.
func loadSeries(samples []Sample, replicas int, start, end time.Duration, buckets int) (time.Duration, [][]float64) {
	if replicas == 0 || end <= start {
		return 0, nil
	}
	width := (end - start + time.Duration(buckets) - 1) / time.Duration(buckets)
	load := make([][]float64, replicas)
	for r := range load {
		load[r] = make([]float64, buckets)
	}
	for _, s := range samples {
		if s.Replica < 0 || s.Rejected {
			continue
		}
		a, b := s.At-start, s.At+s.E2E-start
		for k := int(a / width); k < buckets && time.Duration(k)*width < b; k++ {
			lo, hi := max(a, time.Duration(k)*width), min(b, time.Duration(k+1)*width)
			load[s.Replica][k] += float64(hi - lo)
		}
	}
	for r := range load {
		for k := range load[r] {
			load[r][k] = round6(load[r][k] / float64(width))
		}
	}
	return width, load
}
