// Package leasepb holds the generated protobuf types of the credential
// lease. The schema is lease.proto beside this file; package lease
// (quicwire/lease) documents how a lease is signed, sealed and opened.
package leasepb

// protoc comes from Debian's protobuf-compiler; protoc-gen-go is pinned as a
// tool in go.mod. TestGeneratedCodeIsFresh fails when the committed code is
// stale.
//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative lease.proto"
