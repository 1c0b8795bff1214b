package proxy

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/leak"
)

// TestMain fails the package's tests when they leave a goroutine running.
func TestMain(m *testing.M) { leak.Main(m) }
