// Package pluginpb holds the generated gRPC types of the plugin protocol
// between the Node and an adapter process, and the go-plugin handshake both
// sides use. The schema is adapter.proto beside this file.
//
// The conversation: the Node starts the adapter process; go-plugin checks
// the handshake (magic cookie, protocol version), negotiates mutual TLS on a
// local socket and connects gRPC. The Node calls Describe, then Configure,
// then Execute (one server stream per run, a raw completion included),
// Tunnel (one bidirectional stream per raw HTTP request) and Embed (one
// server stream per embedding call) concurrently, ListTargets and Probe as
// needed, and Close before it stops the process.
package pluginpb

// protoc comes from Debian's protobuf-compiler; protoc-gen-go and
// protoc-gen-go-grpc are pinned as tools in go.mod. Paths are relative to the
// repository root so that adapter.proto imports "quicwire/wirepb/wire.proto".
// gen_test.go fails when the committed code is stale.
//go:generate sh -c "cd ../.. && protoc -I . --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative internal/pluginpb/adapter.proto"
