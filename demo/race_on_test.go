//go:build race

package demo

// raceEnabled is true under -race, which slows the HTTP path by an order
// of magnitude: latency tolerances widen with it.
const raceEnabled = true
