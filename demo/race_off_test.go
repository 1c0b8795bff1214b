//go:build !race

package demo

// raceEnabled is true under -race, which slows every goroutine by an
// order of magnitude, as a busy host does.
const raceEnabled = false
