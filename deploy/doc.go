// Package deploy holds kvrouter's Kubernetes manifests (kubectl apply -k
// deploy/, and deploy/epp/ for the Gateway API endpoint picker) and the
// test that decodes each of them strictly into its API type, so that a
// misspelt field or a broken cross-reference fails `go test` rather than
// `kubectl apply`. It has no Go code of its own.
package deploy
