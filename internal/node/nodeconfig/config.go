// Package nodeconfig is the Node daemon's configuration file: its fields, their defaults and the
// rules a file must satisfy before noded starts. configs/node-*.yaml are commented examples.
//
// Parse and Load decode strictly (see yamlconf.Decode), fill defaults for what the file leaves
// out, and validate; every problem is a *yamlconf.Error that names the field and, when the file
// sets that field or its section, the line.
package nodeconfig

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire"
)

// Defaults and limits.
const (
	// DefaultDrainTimeout is how long a stopping Node lets in-flight runs finish.
	DefaultDrainTimeout = 30 * time.Second
	// MaxDrainTimeout is the longest drain_timeout accepted.
	MaxDrainTimeout = time.Hour
	// DefaultInitialBackoff is the first wait before redialling the Edge.
	DefaultInitialBackoff = 500 * time.Millisecond
	// DefaultMaxBackoff caps the wait between redials as it grows. It is short so that a Node
	// whose link healed, or whose Edge came back, is working again within seconds (P4); the
	// jitter spreads a fleet's redials over half of it.
	DefaultMaxBackoff = 5 * time.Second
	// DefaultCapacity is how many runs a provider executes at once when the file does not say.
	DefaultCapacity = 4
	// MaxCapacity is the largest provider capacity accepted.
	MaxCapacity = 4096
	// MaxTotalCapacity is the largest sum of the providers' capacities: the Node accepts that many
	// dispatched streams plus quicwire.StreamHeadroom, and no more than
	// quicwire.MaxDispatchedStreams, so every slot it offers can open its stream.
	MaxTotalCapacity = quicwire.MaxDispatchedStreams - quicwire.StreamHeadroom
	// DefaultRelistInterval is how often a provider that discovers its targets asks its model
	// server for them again (P1): a model pulled on that box is routable, and a removed one
	// leaves the Edge's selection, within one interval. It equals runtime.DefaultRelistInterval,
	// which a Provider built in code with the field left zero gets.
	DefaultRelistInterval = 30 * time.Second
	// MinRelistInterval and MaxRelistInterval bound relist_interval: more often than once a
	// second only loads the model server; less often than hourly leaves the list stale for hours.
	MinRelistInterval = time.Second
	MaxRelistInterval = time.Hour
	// DefaultIdleStop is how long the plugin process of a provider whose adapter gives a tunnel
	// route (ollama, openai) runs without a call before it is stopped: its raw tunnels are
	// relayed by the Node itself, so only normalized runs, embeddings, listings and probes need
	// the process, and it is started again for the next one (about 50 ms). A provider that
	// serves such calls more often than this keeps its plugin.
	DefaultIdleStop = time.Minute
	// MinIdleStop and MaxIdleStop bound a non-zero idle_stop: a start costs more CPU than a
	// second of an idle process, and a day is as good as never.
	MinIdleStop = time.Second
	MaxIdleStop = 24 * time.Hour
	// MaxLoadedModels bounds a provider's max_loaded_models (issue 23): far above what one
	// server's memory holds.
	MaxLoadedModels = 1024
)

// Adapter kinds a provider may name.
const (
	AdapterOllama    = "ollama"    // Ollama's API, shipped with noded
	AdapterOpenAI    = "openai"    // OpenAI-compatible servers (vLLM, llama.cpp server, LM Studio, hosted APIs), shipped
	AdapterSimulator = "simulator" // the deterministic model server for demos and tests, shipped
	AdapterExternal  = "external"  // a third-party plugin binary, pinned by its SHA-256
)

// Config is the whole noded configuration file.
type Config struct {
	// NodeID names this Node to the Edge; required.
	NodeID   string   `yaml:"node_id"`
	Edge     Edge     `yaml:"edge"`
	Identity Identity `yaml:"identity"`
	// LeaseKeyFile holds the Node's private key that credential leases are sealed to. Empty (the
	// default) means a key generated in memory at each start; a file keeps it across restarts.
	// Load resolves a relative path against the configuration file's directory.
	LeaseKeyFile string `yaml:"lease_key_file"`
	// DrainTimeout is how long a stopping Node lets in-flight runs finish before cancelling
	// them; default 30s, at most 1h.
	DrainTimeout yamlconf.Duration `yaml:"drain_timeout"`
	Reconnect    Reconnect         `yaml:"reconnect"`
	// Stall is how the Node finishes a response stall (R5, R6); the stall
	// timeout itself comes from the Edge with each request (R4).
	Stall     Stall             `yaml:"stall"`
	Limits    Limits            `yaml:"limits"`
	Providers []Provider        `yaml:"providers,omitempty"`
	Labels    map[string]string `yaml:"labels,omitempty"` // free-form tags reported to the Edge
	Log       Log               `yaml:"log"`
	// Wake lists the machines on this Node's LAN it can wake for the Edge (wake.go, issue 23).
	Wake []Wake `yaml:"wake,omitempty"`
}

// Edge is the `edge` section: the Edge or Edges this Node dials first.
//
// With several Edges (a cluster, issue 22), the Node keeps a connection to every Edge: it dials
// the addresses given here (its seeds), learns the cluster's Edge list from each Edge it
// registers with, dials the Edges listed there too, and drops a listed Edge when a later list
// leaves it out. The seeds are never dropped, and one Edge reached both through a seed and at
// its listed address is one connection. A seed may be a load balancer's or a DNS round robin's
// name in front of the Edges.
type Edge struct {
	// Address is one Edge's QUIC listener, host:port. Address or Addresses is required; both may
	// be set.
	Address string `yaml:"address"`
	// Addresses are more Edges' QUIC listeners, host:port each.
	Addresses []string `yaml:"addresses,omitempty"`
	// ServerName is the TLS server name sent to every Edge this Node dials (SNI); empty means the
	// host of each Edge's address. Managed mode identifies an Edge by the edge identity in its
	// certificate, not by this name.
	ServerName string `yaml:"server_name"`
}

// Seeds are the Edge addresses the Node dials first: Address, then Addresses, without repeats.
func (e Edge) Seeds() []string {
	var out []string
	for _, a := range append([]string{e.Address}, e.Addresses...) {
		if a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// Identity is the `identity` section: the shared mode, trust domain and certificate files, plus
// the Edge's id when the Node should insist on one. Load resolves relative ca_file, cert_file and
// key_file against the configuration file's directory.
type Identity struct {
	yamlconf.Identity `yaml:",inline"`
	// EdgeID, when set, is the only Edge the Node accepts at its edge address (noded join writes
	// the id of the Edge it joined through); empty accepts any Edge the identity mode admits
	// there. Either way, at an address learned from a cluster's Edge list the Node accepts only
	// the Edge the list names there: an Edge it trusts vouches for the others. It needs a single
	// edge address: behind a load balancer, or with several addresses, leave it empty.
	EdgeID string `yaml:"edge_id"`
}

// Reconnect is the `reconnect` section: the backoff between dials after the connection to the
// Edge ends. The wait starts at InitialBackoff and grows up to MaxBackoff.
type Reconnect struct {
	InitialBackoff yamlconf.Duration `yaml:"initial_backoff"` // default 500ms
	MaxBackoff     yamlconf.Duration `yaml:"max_backoff"`     // default 5s
}

// Provider is one entry of `providers`: a model server reached through one adapter. Load resolves
// a relative Binary against the configuration file's directory; it is never looked up in $PATH.
type Provider struct {
	Name    string   `yaml:"name"`              // unique among providers; required
	Adapter string   `yaml:"adapter"`           // one of the Adapter constants; required
	Binary  string   `yaml:"binary"`            // the plugin executable; required exactly when Adapter is external
	SHA256  string   `yaml:"sha256"`            // hex SHA-256 of Binary, checked before it runs; required exactly when external
	Targets []string `yaml:"targets,omitempty"` // model names served; may be empty, to be discovered from the server
	// Capacity is how many runs this provider executes at once; default 4, from 1 to 4096.
	Capacity int `yaml:"capacity"`
	// RelistInterval is how often the Node asks the model server for its models again when
	// Targets is empty (P1); changes reach the Edge as they are found. Default 30s, from 1s to
	// 1h; unused when Targets lists the models. A file may not set it to 0; a Provider built in
	// code (edged/dev's Node) may leave it 0 for the default.
	RelistInterval yamlconf.Duration `yaml:"relist_interval"`
	// IdleStop is how long the plugin process of a provider whose adapter gives a tunnel route
	// runs without a call before it is stopped, to be started again by the next call that needs
	// it; the provider stays online and its raw tunnels are relayed meanwhile. Default 1m, from
	// 1s to 24h; 0 keeps the plugin running (as does a Provider built in code that leaves it 0).
	IdleStop yamlconf.Duration `yaml:"idle_stop"`
	// MaxLoadedModels is how many models the model server holds loaded at once (Ollama's
	// OLLAMA_MAX_LOADED_MODELS), told to the Edge so that it sends a model that is not loaded
	// where there is room for it (issue 23). 0 (the default) means not known: the Edge then
	// judges room by whether a loaded model is idle. From 0 to MaxLoadedModels.
	MaxLoadedModels int `yaml:"max_loaded_models"`
	// Config is the adapter's own settings (such as base_url), handed to it as-is.
	Config map[string]any `yaml:"config,omitempty"`
}

// Stall is the `stall` section.
type Stall struct {
	// CloseGrace is how long a stalled provider call, once cancelled, has
	// to return; only a return inside it makes the stall retryable.
	// Default 5s.
	CloseGrace yamlconf.Duration `yaml:"close_grace"`
	// ProbeTimeout bounds the exact-target health probe run after a stall
	// (concurrently with the close grace), and each recovery probe of a
	// target found unavailable. Default 5s.
	ProbeTimeout yamlconf.Duration `yaml:"probe_timeout"`
}

// Stall defaults and bounds.
const (
	DefaultCloseGrace   = 5 * time.Second
	DefaultProbeTimeout = 5 * time.Second
	MaxStallWait        = time.Minute
)

// SetDefaults fills unset durations.
func (s *Stall) SetDefaults() {
	if s.CloseGrace == 0 {
		s.CloseGrace = yamlconf.Duration(DefaultCloseGrace)
	}
	if s.ProbeTimeout == 0 {
		s.ProbeTimeout = yamlconf.Duration(DefaultProbeTimeout)
	}
}

func (s Stall) validate() []*yamlconf.Error {
	var es yamlconf.Errors
	for _, f := range []struct {
		name string
		d    yamlconf.Duration
	}{{"stall.close_grace", s.CloseGrace}, {"stall.probe_timeout", s.ProbeTimeout}} {
		if d := time.Duration(f.d); d <= 0 || d > MaxStallWait {
			es.Add(f.name, "must be more than 0s and at most %s, got %s", MaxStallWait, d)
		}
	}
	return es
}

// Limits is the `limits` section: what the Edge may make the Node hold.
type Limits struct {
	// MaxRequestMiB is the largest run or embedding request the Node takes, in MiB (a session's
	// context with its images; it travels in as many frames as it needs); the Edge is told at
	// registration and sends no larger. Default 64, from 1 to 1024: keep it at or above the
	// Edge's limits.max_request_mib, or the largest requests cannot run here.
	MaxRequestMiB int `yaml:"max_request_mib"`
}

// Bounds of the limits section.
const (
	DefaultMaxRequestMiB = 64
	MaxMaxRequestMiB     = 1024
)

// SetDefaults fills unset limits.
func (l *Limits) SetDefaults() {
	if l.MaxRequestMiB == 0 {
		l.MaxRequestMiB = DefaultMaxRequestMiB
	}
}

func (l Limits) validate() []*yamlconf.Error {
	var es yamlconf.Errors
	if l.MaxRequestMiB < 1 || l.MaxRequestMiB > MaxMaxRequestMiB {
		es.Add("limits.max_request_mib", "must be from 1 to %d, got %d", MaxMaxRequestMiB, l.MaxRequestMiB)
	}
	return es
}

// MaxRequest is MaxRequestMiB in bytes.
func (l Limits) MaxRequest() int { return l.MaxRequestMiB << 20 }

// Log is the `log` section.
type Log = yamlconf.Log

// Default returns the configuration of a file that sets nothing: no node_id and no Edge address
// yet (Validate reports both), mtls identity, default timings and info-level text logs.
func Default() *Config {
	c := &Config{}
	c.SetDefaults()
	return c
}

// SetDefaults fills every unset field with its default; yamlconf.Decode calls it before reading
// the file, so set fields win.
func (c *Config) SetDefaults() {
	c.Identity.SetDefaults()
	if c.DrainTimeout == 0 {
		c.DrainTimeout = yamlconf.Duration(DefaultDrainTimeout)
	}
	c.Reconnect.SetDefaults()
	c.Stall.SetDefaults()
	c.Limits.SetDefaults()
	for i := range c.Providers {
		c.Providers[i].SetDefaults()
	}
	c.Log.SetDefaults()
}

// SetDefaults fills unset backoffs.
func (r *Reconnect) SetDefaults() {
	if r.InitialBackoff == 0 {
		r.InitialBackoff = yamlconf.Duration(DefaultInitialBackoff)
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = yamlconf.Duration(DefaultMaxBackoff)
	}
}

// SetDefaults fills an unset capacity, relist interval and idle stop. yamlconf.Decode calls it for each
// provider in the file before reading its fields, so `capacity: 0` stays 0 and is refused.
func (p *Provider) SetDefaults() {
	if p.Capacity == 0 {
		p.Capacity = DefaultCapacity
	}
	if p.RelistInterval == 0 {
		p.RelistInterval = yamlconf.Duration(DefaultRelistInterval)
	}
	if p.IdleStop == 0 {
		p.IdleStop = yamlconf.Duration(DefaultIdleStop)
	}
}

// Parse decodes a noded configuration file, fills defaults and validates it. The error, when
// not nil, is a yamlconf.Errors listing every problem, each with the line of its field or, for a
// field the file leaves out, of the section or list item it belongs in
// (`providers[1].capacity (line 12): ...`).
//
// Parse has no file to resolve paths against, so it leaves relative paths as written; Load
// resolves them.
func Parse(data []byte) (*Config, error) {
	c := &Config{}
	lines, err := yamlconf.DecodeWithLines(data, c)
	if err != nil {
		return nil, err
	}
	if err := c.validate(true); err != nil {
		return nil, lines.Annotate(err)
	}
	return c, nil
}

// Load reads and parses the file at path; every error names the file
// ("node.yaml: node_id: required").
//
// Relative identity.ca_file, cert_file, key_file, lease_key_file and providers[i].binary are
// resolved against the directory of path, not the working directory, and made absolute:
// `lease_key_file: lease.key` is the lease.key next to the configuration file. Absolute paths
// and empty fields are kept as they are.
func Load(path string) (*Config, error) {
	c, err := yamlconf.Load(path, Parse)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	c.Identity.ResolvePaths(dir)
	c.LeaseKeyFile = yamlconf.ResolvePath(dir, c.LeaseKeyFile)
	for i := range c.Providers {
		c.Providers[i].Binary = yamlconf.ResolvePath(dir, c.Providers[i].Binary)
	}
	return c, nil
}

// Validate reports every problem with c, as a yamlconf.Errors of *yamlconf.Error, or nil. It checks
// values only; it opens no files and dials nothing.
func (c *Config) Validate() error { return c.validate(false) }

// validate is Validate; decoded says c was read from a file, where SetDefaults ran before the
// fields were read, so a zero left in a defaulted field was written there and is refused.
func (c *Config) validate(decoded bool) error {
	var es yamlconf.Errors
	es.Append(yamlconf.CheckID("node_id", c.NodeID))
	if c.Edge.Address == "" && len(c.Edge.Addresses) == 0 {
		es.Add("edge.address", "required, as host:port (or edge.addresses, a list of them)")
	} else if c.Edge.Address != "" {
		es.Append(c.checkEdgeAddress("edge.address", c.Edge.Address)...)
	}
	for i, a := range c.Edge.Addresses {
		path := fmt.Sprintf("edge.addresses[%d]", i)
		if a == c.Edge.Address || slices.Index(c.Edge.Addresses, a) < i {
			es.Add(path, "duplicate edge address %q", a)
			continue
		}
		es.Append(c.checkEdgeAddress(path, a)...)
	}
	es.Append(c.Identity.Validate("identity")...)
	if c.Identity.EdgeID != "" {
		es.Append(yamlconf.CheckID("identity.edge_id", c.Identity.EdgeID))
		if len(c.Edge.Seeds()) > 1 {
			es.Add("identity.edge_id", "accepts one Edge at the edge address, but edge lists %d addresses: leave edge_id empty with several (each Edge learned from the cluster's list must present the id the list names)", len(c.Edge.Seeds()))
		}
	}
	if d := time.Duration(c.DrainTimeout); d <= 0 || d > MaxDrainTimeout {
		es.Add("drain_timeout", "must be more than 0s and at most %s, got %s", MaxDrainTimeout, d)
	}
	es.Append(c.Reconnect.validate()...)
	es.Append(c.Stall.validate()...)
	es.Append(c.Limits.validate()...)
	names := make(map[string]int, len(c.Providers))
	for i, p := range c.Providers {
		path := "providers[" + strconv.Itoa(i) + "]"
		if first, dup := names[p.Name]; dup && p.Name != "" {
			es.Add(path+".name", "duplicate provider name %q (also providers[%d])", p.Name, first)
		}
		names[p.Name] = i
		es.Append(p.validate(path, decoded)...)
	}
	if total := c.TotalCapacity(); total > MaxTotalCapacity {
		es.Add("providers", "the capacities add up to %d; a Node offers at most %d (each slot needs a stream on the Edge's connection)", total, MaxTotalCapacity)
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		if yamlconf.CheckID("", k) != nil {
			es.Add(fmt.Sprintf("labels[%q]", k), "a label name must be 1 to 128 characters of letters, digits, '.', '_' or '-'")
		}
	}
	es.Append(c.Log.Validate("log")...)
	es.Append(c.validateWake()...)
	return es.Err()
}

// checkEdgeAddress checks one Edge address at path.
func (c *Config) checkEdgeAddress(path, addr string) []*yamlconf.Error {
	var es yamlconf.Errors
	host, port, err := yamlconf.CheckHostPort(path, addr)
	switch {
	case err != nil:
		es.Append(err)
	case host == "":
		es.Add(path, "needs a host to dial, got %q", addr)
	case port == 0:
		es.Add(path, "needs a port from 1 to 65535, got %q", addr)
	case c.Identity.Mode == yamlconf.ModeLoopback && !yamlconf.IsLoopbackHost(host):
		es.Add(path, "loopback mode does not authenticate the Edge, so the Node may only dial a loopback address; got %q", addr)
	}
	return es
}

func (r Reconnect) validate() []*yamlconf.Error {
	var es yamlconf.Errors
	initial, maxB := time.Duration(r.InitialBackoff), time.Duration(r.MaxBackoff)
	if initial <= 0 {
		es.Add("reconnect.initial_backoff", "must be more than 0s, got %s", initial)
	}
	if maxB <= 0 {
		es.Add("reconnect.max_backoff", "must be more than 0s, got %s", maxB)
	}
	if initial > 0 && maxB > 0 && initial > maxB {
		es.Add("reconnect.initial_backoff", "must not exceed reconnect.max_backoff (%s), got %s", maxB, initial)
	}
	return es
}

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

func (p Provider) validate(path string, decoded bool) []*yamlconf.Error {
	var es yamlconf.Errors
	es.Append(yamlconf.CheckID(path+".name", p.Name))
	switch p.Adapter {
	case "":
		es.Add(path+".adapter", "required: one of %s", adapterList)
	case AdapterOllama, AdapterOpenAI, AdapterSimulator, AdapterExternal:
	default:
		es.Add(path+".adapter", "must be one of %s; got %q", adapterList, p.Adapter)
	}
	if p.Adapter == AdapterExternal {
		if p.Binary == "" {
			es.Add(path+".binary", "required when adapter is %q", AdapterExternal)
		}
		if p.SHA256 == "" {
			es.Add(path+".sha256", "required when adapter is %q, to pin the binary", AdapterExternal)
		} else if !sha256Hex.MatchString(p.SHA256) {
			es.Add(path+".sha256", "must be 64 hexadecimal digits, got %q", p.SHA256)
		}
	} else {
		if p.Binary != "" {
			es.Add(path+".binary", "only used when adapter is %q; remove it", AdapterExternal)
		}
		if p.SHA256 != "" {
			es.Add(path+".sha256", "only used when adapter is %q; remove it", AdapterExternal)
		}
	}
	seen := make(map[string]bool, len(p.Targets))
	for i, t := range p.Targets {
		tp := fmt.Sprintf("%s.targets[%d]", path, i)
		switch {
		case t == "":
			es.Add(tp, "must not be empty")
		case seen[t]:
			es.Add(tp, "duplicate target %q", t)
		}
		seen[t] = true
	}
	if p.Capacity < 1 || p.Capacity > MaxCapacity {
		es.Add(path+".capacity", "must be from 1 to %d, got %d", MaxCapacity, p.Capacity)
	}
	// Zero in a Provider built in code means the default (see RelistInterval).
	if d := time.Duration(p.RelistInterval); (d != 0 || decoded) && (d < MinRelistInterval || d > MaxRelistInterval) {
		es.Add(path+".relist_interval", "must be from %s to %s, got %s", MinRelistInterval, MaxRelistInterval, d)
	}
	if d := time.Duration(p.IdleStop); d != 0 && (d < MinIdleStop || d > MaxIdleStop) {
		es.Add(path+".idle_stop", "must be 0 (keep the plugin running) or from %s to %s, got %s", MinIdleStop, MaxIdleStop, d)
	}
	if p.MaxLoadedModels < 0 || p.MaxLoadedModels > MaxLoadedModels {
		es.Add(path+".max_loaded_models", "must be from 0 (not known) to %d, got %d", MaxLoadedModels, p.MaxLoadedModels)
	}
	return es
}

// TotalCapacity is the sum of the providers' capacities: how many runs and tunnels the Node
// executes at once.
func (c *Config) TotalCapacity() int {
	total := 0
	for _, p := range c.Providers {
		total += p.Capacity
	}
	return total
}

var adapterList = fmt.Sprintf("%q, %q, %q, %q", AdapterOllama, AdapterOpenAI, AdapterSimulator, AdapterExternal)
