package kvevents

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"

	"kvrouter/prefix"
)

// TestLibzmqPublisher follows a vLLM-shaped publisher running on libzmq
// (pyzmq, testdata/vllm_pub.py): it starts publishing before the
// subscriber connects, so the subscriber joins mid-stream and rebuilds
// from the replay socket. Skipped without /usr/bin/python3 with zmq and
// msgpack (Debian python3-zmq, python3-msgpack).
func TestLibzmqPublisher(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("no %s with zmq and msgpack: %v", py, err)
	}
	cmd := exec.Command(py, "testdata/vllm_pub.py")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var pport, rport int
	if _, err := fmt.Fscan(bufio.NewReader(out), &pport, &rport); err != nil {
		t.Fatalf("read ports: %v", err)
	}
	sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m",
		Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pport), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", rport)}}})
	var want []prefix.Hash
	for seq := range 50 {
		want = append(want, keys("m", "", utoks(seq*8, 8), 4)...)
	}
	slices.Sort(want)
	eventually(t, "the publisher's 100 blocks", func() bool { return idx.Blocks(0) == 100 })
	if got := sorted(idx.Hashes(0)); !slices.Equal(got, want) {
		t.Errorf("index differs from the publisher's blocks")
	}
	if st := status(t, sub, 0); st.DecodeErrors != 0 || st.Orphans != 0 || st.Batches != 50 {
		t.Errorf("status %+v, want 50 batches, no errors", st)
	}
}
