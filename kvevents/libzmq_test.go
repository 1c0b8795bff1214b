package kvevents

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// TestLibzmqPublisher follows a vLLM-shaped publisher running on libzmq
// (pyzmq, testdata/vllm_pub.py) whose first 10 batches went out before the
// subscriber connected: it joins late and rebuilds them from the replay
// socket, asked at connect, whether the publisher numbers batches from 0 (vLLM) or 1
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
			wait.For(t, "the publisher's 100 blocks", func() bool {
				return idx.Blocks(0) == len(want) || status(t, sub, 0).Orphans > 0
			})
			if d := cmp.Diff(want, sorted(idx.Hashes(0))); d != "" {
				t.Errorf("index vs the publisher's blocks (-want +got):\n%s", d)
			}
			st := status(t, sub, 0)
			checkCounts(t, []count{
				{"batches", st.Batches, 50}, {"orphans", st.Orphans, 0}, {"decode errors", st.DecodeErrors, 0},
				{"block size", uint64(st.BlockSize), 4}, {"resets", st.Resets, 0},
			})
			// The replay asked for at connect, and one more when batches
			// published before the publisher took the subscription were
			// lost in between (a gap it fills).
			if st.Replays < 1 || st.Replays > 2 || st.Replays != 1+st.Gaps {
				t.Errorf("replays %d with %d gaps: want the one at connect, and one per gap", st.Replays, st.Gaps)
			}
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

// TestLibzmqOffloadedEarnCredit follows a libzmq publisher whose engine
// offloads to a CPU tier (medium "CPU", vLLM's encoding): the GPU ends
// with the chain's first 50 blocks, the CPU tier with all 100. The GPU
// index and the offload index say so, and kv-aware credits the blocks
// past the GPU's at their load time: the replica is predicted to cache
// the whole chain, loading its second half over PCIe, far cheaper than
// computing it.
func TestLibzmqOffloadedEarnCredit(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("no %s with zmq and msgpack: %v", py, err)
	}
	pport, rport := startPy(t, py, "testdata/vllm_pub.py", "0", "offload")
	off := residency.New(residency.Config{MaxReplicas: 8, DefaultCapacity: 1 << 20})
	sub, idx := startSub(t, Config{Offloaded: off, Replicas: []Replica{{ID: 0, Model: "m",
		Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pport), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", rport)}}})
	wait.For(t, "the publisher's 50 batches", func() bool { return status(t, sub, 0).Batches == 50 })
	chain := keys("m", "", utoks(0, 50*8), 4)
	gpu, cpu := make([]int, 2), make([]int, 2)
	idx.Match(chain, 0, gpu, nil)
	off.Match(chain, 0, cpu, nil)
	if gpu[0] != 50 || cpu[0] != 100 {
		t.Fatalf("GPU index matches %d blocks, offload index %d; want 50 and 100", gpu[0], cpu[0])
	}

	rates := route.Rates{LoadPerMTokens: 2621 * time.Millisecond} // 128 KiB a token at 50 GB/s
	s := &route.Snapshot{BlockSize: 4, Replicas: []route.Replica{
		{ID: "offloading", Healthy: true, Rates: rates}, {ID: "cold", Healthy: true, Rates: rates}}}
	r := &route.Request{ID: "r", Tokens: 401, Blocks: 100, Match: gpu, Offloaded: cpu, Pinned: -1, Costs: make([]route.Cost, 0, 2)}
	d := route.KVAware{Precise: true}.Pick(r, s)
	if d.Replica != 0 || d.Matched != 400 {
		t.Fatalf("decision %+v, want replica 0 predicted to cache all 400 tokens", d)
	}
	k := d.Costs[0]
	if want := time.Duration(200 * float64(rates.LoadPerMTokens) * 1e-6); k.Load != want {
		t.Errorf("load of the CPU tier's 200 tokens priced %v, want %v", k.Load, want)
	}
	r.Offloaded, r.Costs = nil, r.Costs[:0]
	if d := (route.KVAware{Precise: true}).Pick(r, s); d.Matched != 200 {
		t.Errorf("without the offload index: %d cached tokens predicted, want the GPU's 200", d.Matched)
	}
}
