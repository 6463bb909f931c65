// Package frontend is the one front end of the Edge's client APIs (OpenAI,
// Anthropic, Ollama): it owns a request's life from the socket to the last
// byte, and each API plugs in only what differs.
//
// The life, written once (Front.Handler, job.go):
//
//	authenticate → read the body within its bounds (P3) → peek (the model) → plan (resolve once)
//	→ translate (the API's) → begin the timers (S5) → keep-alives → start (the dispatch loop)
//	→ relay → end: a failure in the API's shape, as the status or in the stream → record
//
// What an API supplies, per endpoint (Endpoint): how its body is peeked
// at, and its translation into a Job: a RunJob (a normalized run, R2,
// with the API's RunWriter and keep-alive line), a TunnelJob (the
// provider's own API relayed, R3, with the API's TunnelWriter), an
// EmbedJob (vectors, answered whole), or an Answer the Edge gives from
// what it knows. And once per API (API): how a Failure is rendered as its
// error body.
//
// Failures. Every refusal and failure becomes a *Failure once, by a
// constructor of failure.go, whose code decides its status (statusOf): no
// API picks a status number. Before the answer is committed a failure is
// the HTTP status with the API's error body and the X-IOP-Refusal,
// X-IOP-Liveness and Retry-After headers; after, the writer's in-stream
// form (an SSE error event, an NDJSON error line): never a silent end.
//
// Timers (Exchange): the client going away (ErrClientGone), the
// response-idle timeout from admission (ErrIdleTimeout) and the profile's
// hard deadline each end the request with their own failure; every write
// has the idle timeout as its deadline. Writing (Response): the answer is
// committed at its first byte, keep-alives commit it early, and a streamed
// event is flushed unless the work's next piece is already here.
package frontend
