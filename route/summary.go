package route

import (
	"fmt"
	"math"
	"time"
)

// maxContext caps a Summary row's context, in tokens, so that the sums
// of a million replicas' stay exact in an int64 (2⁵² tokens is some
// thousand times what any fleet's KV holds).
const maxContext = 1 << 52

// Summary is what kv-aware derives of each replica of a snapshot alone,
// whatever the request: whether it is a candidate, its batch and their KV
// context, the prefill queued there, its scales and its preset. Deriving
// that from every Replica is most of a Pick's work on a large fleet, while
// between two decisions only a few replicas change. So whoever keeps a
// snapshot up to date between decisions (the fleet's Decide) keeps its
// Summary too, calling Update for each entry it rewrites, and kv-aware
// reads the Summary's dense rows instead of the replicas. A Pick on a
// snapshot without one (or one kept at another StaleAfter) derives its
// own from scratch; either way the decision is the same.
//
// Snapshot.Summary, when not nil, must be up to date: Update after every
// change of an entry's Healthy, counts, scraped metrics, Rates, or of
// whether its LoadAge is within StaleAfter (Fresh); Reset after a change
// of the replicas' number. Check says whether it is.
type Summary struct {
	staleAfter time.Duration
	rows       []summaryRow
	// presets are the distinct preset fields of the rows' Rates seen since
	// Reset (samePreset), which summaryRow.preset indexes, and inPreset
	// the candidates of each; presetsIn is the presets with any.
	presets   []Rates
	inPreset  []int
	presetsIn int
	// candidates is the rows of candidates (healthy replicas), seqs and
	// tokens the sums of their batches and contexts, in integers so that
	// rows come and go without rounding; ref is one of them (−1: none).
	candidates   int
	seqs, tokens int64
	// outputs and invOutput sum the candidates' Replica.Outputs and
	// InvOutput (in units of 1e−9): their mean 1/output is the ratio.
	outputs, invOutput int64
	// work sums the candidates' PrefillWork, in ns.
	work int64
	ref  int
	// prefillers is the rows of prefill workers that take legs now
	// (Replica.Prefills).
	prefillers int
}

// summaryRow is one replica's entry of a Summary.
type summaryRow struct {
	// batch and context are its running sequences and their KV context
	// in tokens, as kvRequest.batch has them, the context in whole tokens
	// (rounded down, so that quick stays a lower bound).
	batch, context float64
	// decodeScale is its Rates' DecodeScale, with the default; stall and
	// stallInv make its stall weight at the fleet's mean 1/output m̄,
	// stall + stallInv/m̄ (kvRequest.stalled, at its Scale, plus
	// ttftWeight): stallInv is 0 when no request there said its output;
	// stall is
	// its Scale (also with the default) × (batch + ttftWeight): a prefill's compute
	// counts ttftWeight times in the request's latency, and once in each of the
	// batch's (quick); queue is the prefill of the router's own queue
	// there, ttftWeight times, at its Scale, and +Inf for a replica that
	// is not a candidate, so that its quick bound is too (screen).
	decodeScale, stall, stallInv, queue float64
	// scale is its Rates' Scale, with the default, and spread and
	// decodeSpread its spreads (spreads), for the request's own misses
	// (quickMisses).
	scale, spread, decodeSpread float64
	// preset indexes Summary.presets; −1 for a replica that is not a
	// candidate (unhealthy).
	preset int32
	// fresh says its scraped metrics count (Scraped, LoadAge within
	// StaleAfter); prefills is Replica.Prefills.
	fresh, prefills bool
	// outputs and invOutput are its Outputs and InvOutput (in units of
	// 1e−9), and work its PrefillWork in ns, for the totals.
	outputs, invOutput, work int64
}

// nanoInv is x in integer units of 1e−9, so that sums of them stay exact.
func nanoInv(x float64) int64 { return int64(math.Round(x * 1e9)) }

// NewSummary returns an empty Summary for a policy that ignores scraped
// metrics older than staleAfter (kv-aware's Needs.StaleAfter; zero means
// kv-aware's).
func NewSummary(staleAfter time.Duration) *Summary {
	if staleAfter <= 0 {
		staleAfter = kvStaleAfter
	}
	return &Summary{staleAfter: staleAfter}
}

// Reset sizes m for n replicas, none summarised yet: Update each before
// the snapshot is picked from.
func (m *Summary) Reset(n int) {
	m.size(n)
	for i := range m.rows {
		m.rows[i] = summaryRow{queue: math.Inf(1), preset: -1}
	}
}

// size makes m n rows long, their contents and m's totals left to be
// set, the totals zero.
func (m *Summary) size(n int) {
	if cap(m.rows) < n {
		m.rows = make([]summaryRow, n)
	}
	m.rows = m.rows[:n]
	m.presets, m.inPreset, m.presetsIn = m.presets[:0], m.inPreset[:0], 0
	m.candidates, m.seqs, m.tokens, m.ref, m.prefillers = 0, 0, 0, -1, 0
	m.outputs, m.invOutput, m.work = 0, 0, 0
}

// Len is the replicas m summarises.
func (m *Summary) Len() int { return len(m.rows) }

// Seqs is the candidates' running sequences, in all.
func (m *Summary) Seqs() int { return int(m.seqs) }

// Fresh says whether m counted replica i's scraped metrics when it was
// last updated.
func (m *Summary) Fresh(i int) bool { return m.rows[i].fresh }

// IsFresh says whether m counts rp's scraped metrics at its LoadAge: an
// entry whose IsFresh differs from Fresh needs an Update.
func (m *Summary) IsFresh(rp *Replica) bool { return isFresh(rp, m.staleAfter) }

// Update summarises entry i of s anew.
func (m *Summary) Update(s *Snapshot, i int) {
	var row summaryRow
	m.row(&row, s, i)
	if row.preset >= 0 {
		row.preset = m.preset(&s.Replicas[i].Rates)
	}
	m.count(&m.rows[i], -1)
	m.count(&row, 1)
	m.rows[i] = row
	switch {
	case row.preset >= 0 && m.ref < 0:
		m.ref = i
	case row.preset < 0 && m.ref == i:
		m.ref = -1
		for j := range m.rows {
			if m.rows[j].preset >= 0 {
				m.ref = j
				break
			}
		}
	}
}

// count adds row's share of m's totals sign times (1: in, −1: out).
func (m *Summary) count(row *summaryRow, sign int) {
	if row.prefills {
		m.prefillers += sign
	}
	if row.preset < 0 {
		return
	}
	m.candidates += sign
	m.seqs += int64(sign) * int64(row.batch)
	m.tokens += int64(sign) * int64(row.context)
	m.outputs += int64(sign) * row.outputs
	m.invOutput += int64(sign) * row.invOutput
	m.work += int64(sign) * row.work
	k := &m.inPreset[row.preset]
	if *k == 0 || *k+sign == 0 {
		m.presetsIn += sign
	}
	*k += sign
}

// fill summarises every entry of s anew: Reset and an Update of each,
// without taking out rows Reset emptied.
func (m *Summary) fill(s *Snapshot) {
	m.size(len(s.Replicas))
	for i := range m.rows {
		row := &m.rows[i]
		m.row(row, s, i)
		if row.preset >= 0 {
			row.preset = m.preset(&s.Replicas[i].Rates)
			if m.ref < 0 {
				m.ref = i
			}
		}
		m.count(row, 1)
	}
}

// row sets out to entry i of s summarised, its preset 0 for a candidate
// (Update sets it), −1 for another (which keeps only whether it is fresh).
func (m *Summary) row(out *summaryRow, s *Snapshot, i int) {
	rp := &s.Replicas[i]
	fresh := m.IsFresh(rp)
	if !rp.Healthy {
		*out = summaryRow{queue: math.Inf(1), preset: -1, fresh: fresh, prefills: rp.Prefills}
		return
	}
	batch, context := batchOf(rp, fresh, blockSize(s))
	switch { // whole tokens, rounded down: a truncation, far cheaper than math.Floor
	case context >= 0 && context < maxContext:
		context = float64(int64(context))
	case context >= maxContext:
		context = maxContext
	default: // negative or NaN, which batchOf never gives
		context = 0
	}
	scale, decodeScale, perToken := rp.Rates.Scale, rp.Rates.DecodeScale, rp.Rates.PrefillPerToken
	if !(scale > 0) { // as rates fills them
		scale = 1
	}
	if !(decodeScale > 0) {
		decodeScale = 1
	}
	if perToken <= 0 {
		perToken = DefaultPrefillPerToken
	}
	stall, stallInv := scale*(batch+ttftWeight), 0.0
	if rp.Outputs > 0 && rp.InvOutput > 0 {
		stall, stallInv = scale*ttftWeight, scale*batch*rp.InvOutput/float64(rp.Outputs)
	}
	spread, decodeSpread := spreads(&rp.Rates)
	*out = summaryRow{batch: batch, context: context, decodeScale: decodeScale, stall: stall, stallInv: stallInv,
		scale: scale, spread: spread, decodeSpread: decodeSpread,
		outputs: int64(rp.Outputs), invOutput: nanoInv(rp.InvOutput), work: int64(rp.PrefillWork),
		queue: ttftWeight * float64(rp.PrefillTokens) * float64(perToken) * scale, fresh: fresh}
}

// preset is the index of rt's preset fields in m.presets, added if new.
func (m *Summary) preset(rt *Rates) int32 {
	for k := range m.presets {
		if samePreset(rt, &m.presets[k]) {
			return int32(k)
		}
	}
	m.presets, m.inPreset = append(m.presets, *rt), append(m.inPreset, 0)
	return int32(len(m.presets) - 1)
}

// Check reports the first entry of s that m does not summarise as it is
// now, or nil: for tests of whoever keeps a Summary.
func (m *Summary) Check(s *Snapshot) error {
	if len(m.rows) != len(s.Replicas) {
		return fmt.Errorf("summary of %d replicas, snapshot of %d", len(m.rows), len(s.Replicas))
	}
	for i := range m.rows {
		got, want := m.rows[i], summaryRow{}
		m.row(&want, s, i)
		if got.preset >= 0 && want.preset >= 0 {
			if int(got.preset) >= len(m.presets) || !samePreset(&m.presets[got.preset], &s.Replicas[i].Rates) {
				return fmt.Errorf("replica %d (%s) summarised with another preset", i, s.Replicas[i].ID)
			}
			got.preset = want.preset
		}
		if got != want {
			return fmt.Errorf("replica %d (%s) summarised as %+v, is %+v", i, s.Replicas[i].ID, got, want)
		}
	}
	var full Summary
	full.staleAfter = m.staleAfter
	full.fill(s)
	if full.candidates != m.candidates || full.prefillers != m.prefillers || full.outputs != m.outputs || full.invOutput != m.invOutput || full.work != m.work || full.seqs != m.seqs || full.tokens != m.tokens || full.presetsIn != m.presetsIn ||
		(full.ref < 0) != (m.ref < 0) || m.ref >= 0 && m.rows[m.ref].preset < 0 {
		return fmt.Errorf("summary totals %d candidates, %d seqs, %d tokens, %d presets, ref %d; are %d, %d, %d, %d",
			m.candidates, m.seqs, m.tokens, m.presetsIn, m.ref, full.candidates, full.seqs, full.tokens, full.presetsIn)
	}
	return nil
}

// batchOf is rp's running sequences and their KV context in tokens of bs:
// the router's own (every request it has in flight there: one it routed
// since the last scrape is in no scraped figure), or the engine's Running
// when fresh metrics show more (other clients'); the context is the
// router's own footprint, or the engine's used KV when fresh and more.
func batchOf(rp *Replica, fresh bool, bs int) (n, context float64) {
	seqs, blocks := rp.InFlight, float64(rp.DecodeBlocks)
	if fresh {
		seqs = max(seqs, rp.Running)
		if used := rp.KVUsage * float64(rp.CacheBlocks); used > blocks && rp.CacheBlocks > 0 { // false for NaN
			blocks = used
		}
	}
	return float64(seqs), blocks * float64(bs)
}
