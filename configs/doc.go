// Package configs holds the example configuration files the README refers
// to: edge-dev.yaml and node-dev.yaml for one machine in loopback mode,
// edge-managed.yaml and node-managed.yaml for mutual TLS. Its test loads
// each with its daemon's own loader, so an example cannot drift from the
// configuration it documents. The loaders live in internal/edge/edgeconfig,
// internal/node/nodeconfig and, shared by both, internal/yamlconf.
package configs
