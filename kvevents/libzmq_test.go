package kvevents

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLibzmqPublisher follows a vLLM-shaped publisher running on libzmq
// (pyzmq, testdata/vllm_pub.py) whose first 10 batches went out before the
// subscriber connected: it joins late and rebuilds them from the replay
// socket, whether the publisher numbers batches from 0 (vLLM) or 1
// (llm-d-inference-sim). Skipped without /usr/bin/python3 with zmq and
// msgpack (Debian python3-zmq, python3-msgpack).
func TestLibzmqPublisher(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("no %s with zmq and msgpack: %v", py, err)
	}
	want := sorted(keys("m", "", utoks(0, 50*8), 4)) // 50 batches of 2 chained blocks
	for _, first := range []int{0, 1} {
		t.Run(fmt.Sprintf("first=%d", first), func(t *testing.T) {
			pport, rport := startPy(t, py, "testdata/vllm_pub.py", fmt.Sprint(first))
			sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m",
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pport), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", rport)}}})
			eventually(t, "the publisher's 100 blocks", func() bool {
				return idx.Blocks(0) == len(want) || status(t, sub, 0).Orphans > 0
			})
			if d := cmp.Diff(want, sorted(idx.Hashes(0))); d != "" {
				t.Errorf("index vs the publisher's blocks (-want +got):\n%s", d)
			}
			st := status(t, sub, 0)
			checkCounts(t, []count{
				{"batches", st.Batches, 50}, {"orphans", st.Orphans, 0}, {"decode errors", st.DecodeErrors, 0},
				{"replays", st.Replays, 1}, {"block size", uint64(st.BlockSize), 4},
			})
		})
	}
}

// startPy runs a Python publisher script until the test ends and returns
// the PUB and ROUTER ports it prints.
func startPy(t *testing.T, py string, args ...string) (pport, rport int) {
	t.Helper()
	cmd := exec.Command(py, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := fmt.Fscan(bufio.NewReader(out), &pport, &rport); err != nil {
		t.Fatalf("read ports: %v", err)
	}
	return pport, rport
}
