// Package realengine runs kvrouter in front of real engines: a fleet of
// llama.cpp's llama-server replicas, each a separate process serving a
// small random-weight model on the CPU, built by scripts/llamacpp.sh into
// .cache/llamacpp. Its tests (there is no other code) compare what the
// router does and predicts with what the engines count themselves: the
// prompt tokens they processed and reused (llamacpp:prompt_tokens_total,
// llamacpp:prompt_tokens_cached_total), per policy, on workloads where
// session affinity is enough and where it is not; and they run the
// router's failure paths (retries, a stream continued on another replica)
// and its remote tokenizer against a real engine.
//
// Without .cache/llamacpp the tests skip, except under CI=true, where
// they fail: CI builds it (.ci/run) before the tests. No test reads a
// wall clock for its verdict: they assert on counters, and compare
// latencies, if at all, only within one run.
package realengine
