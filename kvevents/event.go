// Package kvevents follows the KV-cache events that vLLM and SGLang publish
// over ZMQ and keeps the residency index equal to each engine's cache.
//
// Wire format (vllm/distributed/kv_events.py, docs/protocols.md): a PUB socket
// sends 3-frame messages (topic, 8-byte big-endian sequence number, msgpack
// event batch); a ROUTER socket replays buffered batches to a DEALER.
// Decode turns a batch in either encoding (legacy tagged arrays, or tagged
// maps) into a Batch; a chain applies it to the index; a Subscriber runs one
// goroutine per replica that keeps its batches in order, detects sequence
// gaps, replays them, and resets the replica when it cannot.
//
// The index is keyed by the router's own chained hash of the token ids each
// BlockStored carries (prefix.ChainTokens from prefix.Root(model, lora)),
// not by the engine's hashes, so that no engine hash algorithm or seed needs
// to match: a request tokenized by the router matches the engine's blocks.
// Engine hashes are mapped to router hashes per replica, for BlockRemoved.
//
// Every event socket is untrusted. Connections are package zmtp's (frame
// sizes bounded before allocation, handshake and read deadlines); the
// bind socket admits only replicas' hosts and Config.Allow, serves each
// connection in its own bounded goroutine, and accepts a message only for
// a replica its sender may publish for; implausible sequence jumps and
// removals of unknown blocks change nothing. Each refusal is counted by
// Reason (Subscriber.Rejected, kvrouter_kv_events_rejected_total).
package kvevents

// Kind is the type of an Event.
type Kind uint8

// Event kinds.
const (
	// Stored is a BlockStored event: the engine cached full blocks.
	Stored Kind = iota + 1
	// Removed is a BlockRemoved event: the engine evicted blocks.
	Removed
	// Cleared is an AllBlocksCleared event: the engine dropped its cache.
	Cleared
)

// String returns the event's wire tag.
func (k Kind) String() string {
	switch k {
	case Stored:
		return "BlockStored"
	case Removed:
		return "BlockRemoved"
	case Cleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Medium is the storage tier of a block (vLLM's `medium`).
type Medium uint8

// Storage tiers. A block absent from GPU memory must be loaded back before
// reuse, so it is worth less to a router than a GPU block.
const (
	// GPU is device memory; an event without a medium means GPU.
	GPU Medium = iota
	// CPU is host memory (KV offloading).
	CPU
	// Disk is local or remote disk.
	Disk
	// OtherMedium is any other tier name.
	OtherMedium
)

// String returns the tier's wire name.
func (m Medium) String() string {
	switch m {
	case GPU:
		return "GPU"
	case CPU:
		return "CPU"
	case Disk:
		return "DISK"
	}
	return "OTHER"
}

// Event is one decoded KV-cache event. Its slices point into the Batch that
// holds it and are valid until the Batch is decoded into again.
type Event struct {
	// Kind is the event type.
	Kind Kind
	// Hashes are the engine's block hashes (Stored, Removed), as uint64:
	// integers as they are (negative int64 as two's complement), byte
	// strings by their last 8 bytes big-endian (vLLM's own uint64 form of
	// its 32-byte hashes).
	Hashes []uint64
	// Parent is the engine hash of the block before Hashes[0]; HasParent
	// is false when the wire value is null or 0 (the chain starts at the
	// root).
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per hash.
	Tokens []uint32
	// BlockSize is tokens per block; Decode fills it from len(Tokens) /
	// len(Hashes) when the wire omits it.
	BlockSize int
	// LoRA is the adapter name (lora_name), "" for the base model.
	LoRA string
	// Medium is the storage tier; GPU when the wire omits it.
	Medium Medium
	// Group is the KV-cache group (group_idx) of hybrid models, 0 if absent.
	Group int
}

// Batch is one decoded message payload: vLLM's KVEventBatch.
type Batch struct {
	// TS is the publisher's timestamp, unix seconds.
	TS float64
	// Events are the batch's events in order.
	Events []Event
	// Rank is the data-parallel rank (data_parallel_rank, or SGLang's
	// attn_dp_rank), -1 when absent.
	Rank int

	hashes []uint64 // arena of every event's Hashes
	tokens []uint32 // arena of every event's Tokens
	spans  []span   // arena offsets per event, fixed up at the end
}

// span locates an event's slices in the batch arenas.
type span struct{ h0, h1, t0, t1 int }

// Blocks returns the number of block events in b: hashes stored or
// removed, plus one per AllBlocksCleared.
func (b *Batch) Blocks() int {
	n := 0
	for i := range b.Events {
		n += max(len(b.Events[i].Hashes), b2i(b.Events[i].Kind == Cleared))
	}
	return n
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// reset empties b for reuse, keeping its memory.
func (b *Batch) reset() {
	b.TS = 0
	b.Events = b.Events[:0]
	b.Rank = -1
	b.hashes = b.hashes[:0]
	b.tokens = b.tokens[:0]
	b.spans = b.spans[:0]
}
