package dashboard

// Browser helpers for the external test package (e2e_test.go).
var StartBrowser = browser

// Console is the console collector StartBrowser returns.
type Console = console

// Errors returns the console errors and uncaught exceptions seen so far.
func (c *console) Errors() []string { return c.errors() }
