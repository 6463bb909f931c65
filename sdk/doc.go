// Package sdk is what a provider adapter imports to plug a model server
// into IOP.
//
// An adapter is a small Go program whose main is one line:
//
//	func main() { sdk.Serve(myadapter.New()) }
//
// Serve speaks the plugin protocol (go-plugin over gRPC, mutually
// authenticated on a local socket) to the Node that started it. Run with the
// single argument "describe", the program prints its Info and capabilities as
// JSON and exits, without serving.
//
// # Lifecycle
//
// The Node starts the program, calls Configure once with the provider's
// configuration, then Execute once per run, concurrently up to the
// provider's capacity. If the program dies, the Node starts a new one and
// configures it again: an adapter keeps no state that outlives its process.
// Close (if implemented) is called before the Node stops the program.
//
// # Runs
//
// Execute receives a normalized Request and sends the run's progress to an
// EventSink, in order: text and reasoning deltas, tool-call deltas, usage.
// It never sends a terminal event: its return value is the run's one
// outcome. A nil error completes the run with the Result; an error fails it,
// and its Kind (see Error) tells the Node and the Edge what went wrong. When
// the run is cancelled, or the Node goes away, ctx is done and Send returns
// ErrHostGone: the adapter must stop its upstream request and return.
//
// # Capabilities
//
// Optional interfaces add capabilities: TargetLister (list the models the
// server has), Tunneler (relay the server's own HTTP API), Prober (is this
// exact model there and answering), Closer (release resources). The SDK
// detects them and reports them, so an adapter cannot claim what it does not
// implement.
//
// # Logging and output
//
// Log with log/slog: while serving, slog's default logger writes JSON lines
// to stderr, which the Node reads into its own log with the adapter's name.
// Never write to stdout: the plugin handshake owns it (the Node logs
// anything else that appears there as a mistake).
//
// # Testing
//
// The conformance kit, package sdk/sdktest, checks an adapter through the
// real plugin path (describe, strict config, honest capabilities, ordering,
// cancellation without leaks, error kinds, concurrency, restart, a clean
// stdout): sdktest.Run(t, sdktest.Subject{Adapter: New}, opts) in a test,
// or `noded adapter verify ./my-adapter` on a built binary. An adapter's own
// checks drive it with these same types (sdktest.Session); the package
// example shows an adapter and its check.
//
// This package imports no networking or wiring library of the Node or the
// Edge; adapters stay small.
package sdk
