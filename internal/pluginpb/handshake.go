package pluginpb

// The go-plugin handshake shared by sdk.Serve (plugin side) and pluginhost
// (host side). The host re-exports these values.
const (
	// ProtocolVersion is the plugin protocol version. Bump it only for a
	// change old peers cannot ignore; adding fields does not need it.
	ProtocolVersion = 1
	// MagicCookieKey and MagicCookieValue tell an adapter binary that a
	// host started it (and a user running it by hand that it is a plugin).
	MagicCookieKey   = "IOP_ADAPTER_PLUGIN"
	MagicCookieValue = "8f3c2a91d7e64b05a1c9e6f4b2d70c38"
	// PluginName is the name the adapter service is dispensed under.
	PluginName = "adapter"
)
