package prefix

import (
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// pyVLLMHashes computes vLLM's sha256_cbor block hashes with Python's cbor2
// and hashlib (Debian's python3-cbor2), independently of this package.
const pyVLLMHashes = `
import sys, hashlib, cbor2
seed, lora, salt = sys.argv[1], sys.argv[2], sys.argv[3]
tokens = [int(t) for t in sys.argv[4].split(",")]
h = lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
parent = h(seed)
for i in range(0, len(tokens) - 15, 16):
    extra = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
    parent = h((parent, tuple(tokens[i:i+16]), tuple(extra) if extra else None))
    print(parent.hex())
`

func TestVLLMHashesMatchPython(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import cbor2").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3-cbor2 missing in CI (.ci/run installs it): %v", err)
		}
		t.Skipf("python3 with cbor2 not available: %v", err)
	}
	tokens := make([]uint32, 50)
	var csv []string
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 151643
		if i == 3 {
			tokens[i] = 100000 // a 4-byte CBOR integer
		}
		csv = append(csv, itoa(tokens[i]))
	}
	for _, c := range []VLLM{
		{Seed: "0"},
		{Seed: "42", LoRA: "sql-adapter"},
		{Seed: "0", CacheSalt: "tenant-a"},
		{Seed: "7", LoRA: "x", CacheSalt: "y"},
	} {
		out, err := exec.Command(py, "-c", pyVLLMHashes, c.Seed, c.LoRA, c.CacheSalt, strings.Join(csv, ",")).Output()
		if err != nil {
			t.Fatalf("python: %v", err)
		}
		want := strings.Fields(string(out))
		got, err := c.Blocks(tokens)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || len(got) != 3 {
			t.Fatalf("%+v: got %d blocks, python %d, want 3", c, len(got), len(want))
		}
		for i := range got {
			if g := hex.EncodeToString(got[i][:]); g != want[i] {
				t.Errorf("%+v block %d: got %s, python %s", c, i, g, want[i])
			}
		}
	}
}

func itoa(v uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
