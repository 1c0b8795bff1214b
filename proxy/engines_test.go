package proxy

import (
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestParseBackendEngine: engine= is read, written back and checked; the
// YAML mapping takes it too.
func TestParseBackendEngine(t *testing.T) {
	b, err := ParseBackend("http://e:8080,engine=llamacpp,model=m")
	if err != nil || b.Engine != "llamacpp" || b.String() != "http://e:8080,model=m,engine=llamacpp" {
		t.Errorf("got %+v %q, %v; want engine llamacpp", b, b.String(), err)
	}
	if _, err := ParseBackend("http://e:8080,engine=ollama"); err == nil {
		t.Error("engine=ollama accepted")
	}
	var m Backend
	if err := yaml.Unmarshal([]byte("url: http://e:8080\nengine: llamacpp\n"), &m); err != nil || m.Engine != "llamacpp" {
		t.Errorf("YAML mapping: %+v, %v; want engine llamacpp", m, err)
	}
}
