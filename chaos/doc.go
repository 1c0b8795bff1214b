// Package chaos holds kvrouter's fault and hostile-input suite: real
// kvrouter processes (routers and emulated engines) on loopback, driven
// into the failures an edge proxy meets (dead and hung replicas, hostile
// frames and bodies, slow and idle clients, signals), with assertions on
// what the client sees and on the router's memory. The tests are short by
// default; -chaos.long runs the long versions (soak, long drains).
package chaos
