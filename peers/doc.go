// Package peers shares a fleet's view with the other routers in front of
// the same replicas, through Redis, so that N routers decide as one would:
// each counts the others' in-flight load, a conversation stays on its
// replica whichever router its turns reach, and the blocks a router just
// routed (the approximate index's entries, the precise mode's just-routed
// overlay) are known to all. Precise mode's index needs nothing from here:
// every router subscribes to the engines' KV events itself.
//
// What is shared, and how it is folded in, is package fleet's
// (fleet.Share, Fleet.Export, Fleet.Merge): the simulator's N routers
// exchange the same shares on their virtual clock. This package is the
// live transport.
//
// # Protocol
//
// Every Interval (default 50 ms) a background goroutine, the Syncer, runs
// one round: it exports its fleet's share and, in one pipeline,
//
//   - SET {prefix}:load:{router} to its load (its own in-flight requests,
//     prefill tokens, decoding requests and KV tokens per replica: absolute
//     counts, not deltas, so a lost round costs nothing) with a TTL of TTL
//     (default 20 intervals, 1 s): the key of a router that stops
//     refreshing it, one that died or lost Redis, expires, and its load
//     with it;
//   - SADD {prefix}:routers {router}, the set of routers to read;
//   - XADD {prefix}:events MAXLEN ~ StreamLen, when it bound sessions or
//     routed blocks since its previous round: those deltas, once (a round
//     that fails keeps them, bounded, for the next);
//   - SRANDMEMBER {prefix}:routers MaxRouters (all of them, up to that
//     many) and XREAD COUNT 256 {prefix}:events from the
//     last entry it read (not blocking);
//
// then reads the other routers' load keys, each with GETRANGE up to
// MaxShareBytes (SREMming routers whose key has
// expired) and merges: the peers' load replaces the previous round's, their
// bindings and blocks enter the fleet. A router starting reads the stream
// from its start, so it learns the bindings of the last StreamLen rounds.
//
// Two things do not wait for a round: a session's binding, queued for
// its own key as the decision is made (written by a writer goroutine, in
// order, a pipeline at a time) and read by any router before it decides
// on that session (sessions.go: read-your-writes across routers, the read
// and the caller's wait for the write each bounded by ReadTimeout), and
// the membership the admin API
// changes (members.go: a hash every round checks the version of, applied
// through Config.ApplyMembers; a router starting loads it).
//
// # Sealed values
//
// With Settings.KeyFile every value written (load, stream entry, member,
// binding) is sealed with an HMAC of its key, its writer and itself, and
// every value read is checked, after its size, before it is decoded
// (seal.go); what fails is ignored and counted by kind.
//
// # Staleness
//
// A decision sees the other routers' load as of their last round read in
// this router's last round: at most about 2 × Interval + one round trip
// old (100 ms and change at the default). Within that window, requests
// routed by others are missed: N routers each sending k requests an
// interval may pile up to 2k(N−1) requests unseen on one replica before the
// load shows (the engines' scraped queues, read by every router, bound it
// too). A session bound by one router is known to the others at once
// (its key, read before each decision on it), with the blocks of the
// prompt it was bound with. A dead router's load is counted
// until its key expires: TTL at most.
//
// # Without Redis
//
// The request path waits on Redis only for a session's binding, at most
// ReadTimeout to read it and as long for its write: the Syncer does every
// other I/O, each command bounded by Timeout, and the fleet reads its
// peers' load through an atomically swapped view. When Redis is down or slow, a round
// fails: kvrouter_shared_state_up goes to 0 (logged once), the router
// routes on its own view (after TTL without a successful round the peers'
// load is dropped, as theirs drops this router's), its deltas wait,
// bounded, and the next round that succeeds publishes them and sets the
// gauge back to 1 (logged). A Redis that restarted empty is refilled
// within one round (load, routers) and by the deltas that follow;
// bindings made before it are kept by the routers that made them.
package peers
