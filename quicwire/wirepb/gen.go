// Package wirepb holds the generated protobuf types of the Edge–Node wire.
// The schema is wire.proto beside this file; package quicwire documents the
// conversation these messages make up.
package wirepb

// protoc comes from Debian's protobuf-compiler; protoc-gen-go is pinned as a
// tool in go.mod. .ci/check-generated fails when the committed code is stale.
//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative wire.proto"
