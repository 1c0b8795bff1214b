package engine

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// Request is one inference request as the engine model sees it.
type Request struct {
	// ID identifies the request in events and in Cancel.
	ID string
	// Tokens are the prompt's token ids. The simulator may leave them nil and
	// give Prompt and Hashes instead.
	Tokens []uint32
	// Prompt is the prompt length in tokens; zero means len(Tokens).
	Prompt int
	// Hashes are the chained hashes of the prompt's full blocks; nil means
	// the engine computes them from Tokens and LoRA.
	Hashes []prefix.Hash
	// MaxTokens is the number of output tokens to generate, at least 1.
	MaxTokens int
	// LoRA names the adapter; it is an extra key of every block hash.
	LoRA string
	// RemoteBlocks is how many of the prompt's leading blocks a peer
	// replica sends before the prefill, as a KV connector (vLLM's
	// do_remote_prefill) does: those not already on the GPU or the CPU
	// tier arrive over the interconnect, no earlier than RemoteSent, when
	// the peer's side of the link has sent them (Engine.Send). Zero means
	// none.
	RemoteBlocks int
	RemoteSent   time.Duration
	// HoldFor keeps the request's blocks for that long after it finishes,
	// for a peer to read (a P/D prefill leg, vLLM's do_remote_decode; see
	// hold.go): Done reports the held prompt blocks in HeldBlocks, and Read
	// serves them. Zero frees them at once, as any request's.
	HoldFor time.Duration
}

// Kind says what an Event reports.
type Kind uint8

// Event kinds.
const (
	// FirstToken: the request's prefill finished and its first output token
	// is out.
	FirstToken Kind = iota + 1
	// Token: one more output token (not emitted with Config.NoTokenEvents).
	Token
	// Done: the request finished; the event carries its usage.
	Done
	// BlockStored: full blocks were computed and became reusable.
	BlockStored
	// BlockRemoved: cached blocks were evicted.
	BlockRemoved
	// AllCleared: every cached block was dropped.
	AllCleared
)

// Event is one thing the engine reports from a Step.
type Event struct {
	Kind Kind
	// At is when it happened on the engine's clock.
	At time.Duration
	// Req is the request's ID (FirstToken, Token, Done).
	Req string

	// Done carries the request's usage and timing.
	PromptTokens, CachedTokens, OutputTokens int
	// CPUCachedTokens and RemoteCachedTokens are the parts of
	// CachedTokens loaded from the CPU tier and received from a peer
	// (Request.RemoteBlocks) rather than hit on the GPU.
	CPUCachedTokens, RemoteCachedTokens int
	// Arrived, Started and First are when the request was added, when its
	// prefill was first scheduled, and when its first token came out.
	Arrived, Started, First time.Duration
	// Preemptions counts how often the request was preempted (recompute).
	Preemptions int
	// Canceled is true for a request ended by Cancel.
	Canceled bool
	// HeldBlocks are the engine's ids of the request's full prompt
	// blocks, in order, when it finished with Request.HoldFor and had at
	// least one (Read takes them); nil otherwise.
	HeldBlocks []int32

	// Medium is the tier the blocks were stored on or removed from
	// (BlockStored, BlockRemoved); AllCleared clears every tier.
	Medium Medium
	// Hashes are the blocks stored or removed, in chain order for BlockStored.
	Hashes []prefix.Hash
	// Parent is the hash of the block before Hashes[0]; HasParent is false at
	// the root.
	Parent    prefix.Hash
	HasParent bool
	// TokenIDs are the stored blocks' tokens, BlockSize per hash, when the
	// request carried tokens.
	TokenIDs []uint32
	// BlockSize is tokens per block; LoRA is the adapter name.
	BlockSize int
	LoRA      string
}
