//go:build !race

package proxy

// raceEnabled is true under -race, which slows the HTTP path by an order
// of magnitude: wall-clock latency checks loosen with it.
const raceEnabled = false
