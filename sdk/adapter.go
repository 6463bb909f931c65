package sdk

import (
	"context"
	"errors"
)

// Adapter is the interface every adapter implements.
type Adapter interface {
	// Info describes the adapter. It must not fail or block.
	Info() Info
	// Configure receives the provider's configuration before any run,
	// and again after every restart of the process. Reject unknown keys
	// (DecodeConfig does).
	Configure(ctx context.Context, cfg Config) error
	// Execute runs one normalized run, sending its progress to out, and
	// returns its outcome: a Result, or an error (preferably an *Error
	// with a Kind). It is called concurrently for different runs.
	Execute(ctx context.Context, req *Request, out EventSink) (*Result, error)
}

// EventSink receives a run's events.
type EventSink interface {
	// Send delivers ev to the host, in order. It returns ErrHostGone once
	// the run is cancelled or the host has gone; the adapter must then
	// stop and return.
	Send(ctx context.Context, ev Event) error
}

// ErrHostGone is returned by EventSink.Send and TunnelResponse when the run
// or tunnel was cancelled or the host is gone.
var ErrHostGone = errors.New("sdk: host gone or run cancelled")

// TargetLister is implemented by adapters that can list the server's models.
type TargetLister interface {
	ListTargets(ctx context.Context) ([]Target, error)
}

// Tunneler is implemented by adapters that relay the server's own HTTP API.
type Tunneler interface {
	// Tunnel sends req to the server and streams its answer to resp,
	// returning when the answer is complete (nil) or failed.
	Tunnel(ctx context.Context, req *TunnelRequest, resp TunnelResponse) error
}

// Completer is implemented by adapters whose server continues raw text
// (OpenAI's /v1/completions, Ollama's /api/generate): a raw completion run,
// whose Request has a Prompt, maybe a Suffix (fill-in-the-middle), and no
// Messages or Tools. It streams and ends like Execute. A server that cannot
// fill in the middle fails a run with a Suffix with KindUnsupported; it
// never drops the suffix. Without Completer, the host refuses raw
// completions for the adapter with KindUnsupported.
type Completer interface {
	Complete(ctx context.Context, req *Request, out EventSink) (*Result, error)
}

// Embedder is implemented by adapters whose server computes embeddings.
// Embed returns one vector per input, in input order, all of one length
// (req.Dimensions when set and the model can shorten its vectors; a model
// that cannot fails with KindUnsupported or KindInvalidRequest rather than
// answer longer ones). It is called concurrently for different calls.
type Embedder interface {
	Embed(ctx context.Context, req *EmbedRequest) (*EmbedResult, error)
}

// TokenCounter is implemented by adapters whose server can tokenize: it
// counts the tokens of req's prompt (its Messages and Tools, or a raw
// completion's Prompt and Suffix) as the model would read them, with its
// chat template where the server applies one. It runs nothing. Clients
// call it to manage their context (Anthropic's count_tokens); without it,
// the Edge estimates.
type TokenCounter interface {
	CountTokens(ctx context.Context, req *Request) (int64, error)
}

// Prober is implemented by adapters that can check one exact target: is
// this model there and answering? Probe has its own short deadline in ctx.
type Prober interface {
	Probe(ctx context.Context, target string) (Health, error)
}

// Closer is implemented by adapters that hold resources to release.
type Closer interface {
	Close(ctx context.Context) error
}
