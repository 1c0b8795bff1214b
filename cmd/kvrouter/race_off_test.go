//go:build !race

package main

// raceEnabled: the tests run with -race, and so is the kvrouter binary
// they build (sharing the compiled packages).
const raceEnabled = false
