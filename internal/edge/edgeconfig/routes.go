package edgeconfig

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// DefaultProfileName names the profile that always exists and that a route without a profile
// uses.
const DefaultProfileName = "default"

// Defaults and bounds of a profile's fields (SPEC S5, R4), and of model names.
const (
	// DefaultDeadline is a profile's request hard deadline when the file sets none.
	DefaultDeadline = 10 * time.Minute
	// DefaultQueueTimeout is how long a request may wait for a slot when the file sets nothing.
	DefaultQueueTimeout = 30 * time.Second
	// DefaultMaxQueueDepth is how many requests may wait per model when the file sets nothing.
	DefaultMaxQueueDepth = 64
	// IdleAfterStall is how much longer than the profile's response_stall_timeout the client
	// response-idle timeout is when the file sets none: a silent run is then ended by the Node's
	// stall watchdog, with its evidence, and not by the Edge's blind timer (issue 11). The
	// margin covers the stall's close grace and probe and the terminal's way back.
	IdleAfterStall = time.Minute
	// DefaultIdleTimeout is the idle timeout of a profile that sets neither it nor the stall
	// timeout.
	DefaultIdleTimeout = DefaultResponseStallTimeout + IdleAfterStall
	// DefaultKeepAliveInterval is how often a streamed OpenAI response that has nothing to say
	// yet (queued, or in a silent prefill) gets an SSE comment line, when the file sets none.
	DefaultKeepAliveInterval = 15 * time.Second
	// DefaultResponseStallTimeout is the provider stall timeout when the file sets none; it is
	// also what a Node reads a wire value of 0 as.
	DefaultResponseStallTimeout = 5 * time.Minute

	// MaxDeadline is the longest request hard deadline.
	MaxDeadline = 24 * time.Hour
	// MaxQueueTimeout is the longest a request may be allowed to wait for a slot.
	MaxQueueTimeout = time.Hour
	// MaxQueueDepth is the largest max_queue_depth.
	MaxQueueDepth = 100_000
	// MaxIdleTimeout is the longest client response-idle timeout.
	MaxIdleTimeout = 24 * time.Hour
	// MaxKeepAliveInterval is the longest keepalive_interval.
	MaxKeepAliveInterval = 10 * time.Minute
	// MinResponseStallTimeout is the shortest response_stall_timeout.
	MinResponseStallTimeout = time.Millisecond
	// MaxResponseStallTimeout is the longest response_stall_timeout: the largest
	// response_stall_timeout_ms a Node accepts (R4).
	MaxResponseStallTimeout = time.Hour

	// MaxModelName bounds a route's model and a target's name, in bytes.
	MaxModelName = 256
)

// Profile is one entry of `profiles`: the timers and queue limits of the requests on the routes
// that name it. Each timer has its own owner and its own error (SPEC S5).
type Profile struct {
	Name string `yaml:"name"` // unique; id rules (see yamlconf.CheckID)
	// Deadline is the request's hard deadline, from arrival to its last byte, queueing included;
	// default 10m, more than 0 and at most 24h.
	Deadline yamlconf.Duration `yaml:"deadline"`
	// QueueTimeout is how long a request may wait for a free slot when every candidate is busy;
	// 0 means never queue (refuse at once). Default 30s, at most 1h.
	QueueTimeout yamlconf.Duration `yaml:"queue_timeout"`
	// MaxQueueDepth is how many requests may wait per model at once; a request beyond it is
	// refused as queue_full. Default 64, from 0 to 100000.
	MaxQueueDepth int `yaml:"max_queue_depth"`
	// IdleTimeout is the client response-idle timeout: when no byte of the answer has gone to
	// the client for this long, counted from admission (the queue wait is queue_timeout's), the
	// request ends. Default response_stall_timeout + 1m (6m): longer than the stall timeout, so
	// a silent prefill is the stall watchdog's to judge. More than 0 and at most 24h.
	IdleTimeout yamlconf.Duration `yaml:"idle_timeout"`
	// KeepAliveInterval is how often a streamed OpenAI response with nothing to send yet, while
	// the request is queued or in a silent prefill, gets an SSE comment line (": keep-alive"),
	// which clients ignore and proxies with a first-byte limit count as traffic. The first one
	// commits the response (200, text/event-stream); an error after it is an in-stream error
	// event. Keep-alives are not answer bytes: they do not hold off the idle timeout. Default
	// 15s; 0 turns them off; at most 10m.
	KeepAliveInterval yamlconf.Duration `yaml:"keepalive_interval"`
	// ResponseStallTimeout is the provider response-stall timeout that travels on every run and
	// tunnel request as response_stall_timeout_ms, for the Node's stall watchdog (R4, R5).
	//
	// R4 calls it a per-provider setting, but providers are configured on Nodes and the Edge has
	// no provider list; so the Edge takes it from the profile of the request's route, and every
	// provider that route selects, including a candidate re-resolved after a failover, gets the
	// same value. Default 5m; from 1ms to 1h, in whole milliseconds.
	ResponseStallTimeout yamlconf.Duration `yaml:"response_stall_timeout"`
	// Credential names an entry of `credentials` whose value the model servers of this profile's
	// routes need. Each dispatch then carries a lease of it, sealed to the Node (SPEC R11). Empty
	// (the default) means no credential. Only allowed in mtls (managed) mode (SPEC S3).
	Credential string `yaml:"credential,omitempty"`
	// HostedTools is what a request that names a tool only a hosted API runs (OpenAI's
	// web_search, file_search, code_interpreter, mcp, computer use, image generation;
	// Anthropic's server tools) gets: HostedToolsDrop (the default) runs it without them and
	// names what was dropped in the X-IOP-Dropped-Tools header; HostedToolsRefuse answers 400.
	// "" means HostedToolsDrop.
	HostedTools string `yaml:"hosted_tools,omitempty"`
}

// What a profile does with tools only a hosted API runs (Profile.HostedTools).
const (
	HostedToolsDrop   = "drop"
	HostedToolsRefuse = "refuse"
)

// DefaultProfile returns the profile named DefaultProfileName with every default, which is what
// that profile is when the file does not define it.
func DefaultProfile() Profile {
	p := Profile{Name: DefaultProfileName}
	p.SetDefaults()
	p.deriveDefaults()
	return p
}

// deriveDefaults fills the defaults that depend on other fields, once the file is read: an
// unset (or zero) idle_timeout is response_stall_timeout + IdleAfterStall.
func (p *Profile) deriveDefaults() {
	if p.IdleTimeout == 0 {
		p.IdleTimeout = p.ResponseStallTimeout + yamlconf.Duration(IdleAfterStall)
	}
}

// SetDefaults fills every unset field but the name and the idle timeout, which deriveDefaults
// fills from the stall timeout once the file is read. yamlconf.Decode calls it for each profile
// in the file before reading its fields, so `queue_timeout: 0` stays 0 (never queue).
func (p *Profile) SetDefaults() {
	if p.Deadline == 0 {
		p.Deadline = yamlconf.Duration(DefaultDeadline)
	}
	if p.QueueTimeout == 0 {
		p.QueueTimeout = yamlconf.Duration(DefaultQueueTimeout)
	}
	if p.MaxQueueDepth == 0 {
		p.MaxQueueDepth = DefaultMaxQueueDepth
	}
	if p.KeepAliveInterval == 0 {
		p.KeepAliveInterval = yamlconf.Duration(DefaultKeepAliveInterval)
	}
	if p.ResponseStallTimeout == 0 {
		p.ResponseStallTimeout = yamlconf.Duration(DefaultResponseStallTimeout)
	}
}

// ResponseStallTimeoutMS is ResponseStallTimeout as the response_stall_timeout_ms wire value.
func (p Profile) ResponseStallTimeoutMS() int64 {
	return time.Duration(p.ResponseStallTimeout).Milliseconds()
}

// Route is one entry of `routes`: a model name clients ask for, the profile its requests run
// under, and the targets that may serve it.
type Route struct {
	Name string `yaml:"name"` // unique; id rules (see yamlconf.CheckID); what principals name
	// Model is the model name clients send (`model` in an OpenAI or Ollama request). Unique among
	// routes, where a name and the same name with ":latest" count as one (see RouteForModel).
	Model   string `yaml:"model"`
	Profile string `yaml:"profile"` // a profile's name; default DefaultProfileName
	// Targets are the candidates. Empty means any provider on a ready Node that serves a target
	// equal to Model or to Model + ":latest".
	Targets []Target `yaml:"targets,omitempty"`
}

// SetDefaults fills an unset profile with DefaultProfileName.
func (r *Route) SetDefaults() {
	if r.Profile == "" {
		r.Profile = DefaultProfileName
	}
}

// Target is one candidate of a route: a provider target (the model name on the provider), and
// optionally which adapter and which Nodes may serve it.
type Target struct {
	Target  string   `yaml:"target"`            // the provider's model name; required
	Adapter string   `yaml:"adapter,omitempty"` // only providers of this adapter (such as "ollama"); empty means any
	Nodes   []string `yaml:"nodes,omitempty"`   // only these Nodes, by node id; empty means any
}

// Profile returns the profile called name. The profile DefaultProfileName always exists: as the
// file defines it, or else DefaultProfile(). Any other name that the file does not define (which
// Validate refuses for a route) gives the default profile, so a caller always has usable timers.
func (c *Config) Profile(name string) Profile {
	for _, p := range c.Profiles {
		if p.Name == name {
			return p
		}
	}
	if name != DefaultProfileName {
		return c.Profile(DefaultProfileName)
	}
	return DefaultProfile()
}

// RouteForModel returns the route whose model is model, and false when there is none. A name
// without a tag and the same name with ":latest" are the same model, as in Ollama: a request for
// "llama3.2" finds the route for "llama3.2:latest" and the other way round. Names are otherwise
// compared exactly.
func (c *Config) RouteForModel(model string) (Route, bool) {
	for _, r := range c.Routes {
		if r.Model == model {
			return r, true
		}
	}
	alt := latestTwin(model)
	for _, r := range c.Routes {
		if r.Model == alt {
			return r, true
		}
	}
	return Route{}, false
}

// latestTwin returns the other spelling of a model name with respect to the ":latest" tag:
// "m:latest" for "m" and "m" for "m:latest".
func latestTwin(model string) string {
	if base, ok := strings.CutSuffix(model, ":latest"); ok {
		return base
	}
	return model + ":latest"
}

// validateRoutes checks the profiles and routes sections.
func (c *Config) validateRoutes() yamlconf.Errors {
	var es yamlconf.Errors
	profiles := map[string]string{} // name → path of its first entry
	for i, p := range c.Profiles {
		path := fmt.Sprintf("profiles[%d]", i)
		if err := yamlconf.CheckID(path+".name", p.Name); err != nil {
			es.Append(err)
		} else if first, dup := profiles[p.Name]; dup {
			es.Add(path+".name", "duplicate profile %q (first at %s)", p.Name, first)
		} else {
			profiles[p.Name] = path
		}
		es.Append(p.validate(path)...)
	}

	names := map[string]string{}  // route name → path of its first entry
	models := map[string]string{} // model without ":latest" → path of the first route's model
	for i, r := range c.Routes {
		path := fmt.Sprintf("routes[%d]", i)
		if err := yamlconf.CheckID(path+".name", r.Name); err != nil {
			es.Append(err)
		} else if first, dup := names[r.Name]; dup {
			es.Add(path+".name", "duplicate route %q (first at %s)", r.Name, first)
		} else {
			names[r.Name] = path
		}
		if err := checkModelName(path+".model", r.Model); err != nil {
			es.Append(err)
		} else {
			key, _ := strings.CutSuffix(r.Model, ":latest")
			if first, dup := models[key]; dup {
				es.Add(path+".model", "model %q is already routed by %s (a name and the name with \":latest\" are one model)", r.Model, first)
			} else {
				models[key] = path + ".model"
			}
		}
		if _, ok := profiles[r.Profile]; !ok && r.Profile != DefaultProfileName {
			es.Add(path+".profile", "unknown profile %q; define it under profiles, or use %q", r.Profile, DefaultProfileName)
		}
		es.Append(validateTargets(path+".targets", r.Targets)...)
	}
	return es
}

// validate checks the timers and the queue depth of p, naming fields under path.
func (p Profile) validate(path string) yamlconf.Errors {
	var es yamlconf.Errors
	if d := time.Duration(p.Deadline); d <= 0 || d > MaxDeadline {
		es.Add(path+".deadline", "must be more than 0 and at most %s, got %s", MaxDeadline, d)
	}
	if d := time.Duration(p.QueueTimeout); d < 0 || d > MaxQueueTimeout {
		es.Add(path+".queue_timeout", "must be from 0 (never queue) to %s, got %s", MaxQueueTimeout, d)
	}
	if p.MaxQueueDepth < 0 || p.MaxQueueDepth > MaxQueueDepth {
		es.Add(path+".max_queue_depth", "must be from 0 to %d, got %d", MaxQueueDepth, p.MaxQueueDepth)
	}
	if d := time.Duration(p.IdleTimeout); d <= 0 || d > MaxIdleTimeout {
		es.Add(path+".idle_timeout", "must be more than 0 and at most %s, got %s", MaxIdleTimeout, d)
	}
	if d := time.Duration(p.KeepAliveInterval); d < 0 || d > MaxKeepAliveInterval {
		es.Add(path+".keepalive_interval", "must be from 0 (off) to %s, got %s", MaxKeepAliveInterval, d)
	}
	switch d := time.Duration(p.ResponseStallTimeout); {
	case d < MinResponseStallTimeout || d > MaxResponseStallTimeout:
		es.Add(path+".response_stall_timeout", "must be from %s to %s, got %s", MinResponseStallTimeout, MaxResponseStallTimeout, d)
	case d%time.Millisecond != 0:
		es.Add(path+".response_stall_timeout", "must be a whole number of milliseconds (it travels as response_stall_timeout_ms), got %s", d)
	}
	if p.HostedTools != "" && p.HostedTools != HostedToolsDrop && p.HostedTools != HostedToolsRefuse {
		es.Add(path+".hosted_tools", "must be %q or %q, got %q", HostedToolsDrop, HostedToolsRefuse, p.HostedTools)
	}
	return es
}

// validateTargets checks a route's targets: each names a target, an optional adapter and Nodes
// by id, and no two entries name the same target and adapter.
func validateTargets(path string, targets []Target) yamlconf.Errors {
	var es yamlconf.Errors
	type key struct{ target, adapter string }
	seen := map[key]string{}
	for i, t := range targets {
		tp := fmt.Sprintf("%s[%d]", path, i)
		if err := checkModelName(tp+".target", t.Target); err != nil {
			es.Append(err)
		} else if first, dup := seen[key{t.Target, t.Adapter}]; dup {
			es.Add(tp, "the same target and adapter as %s; list all its nodes in one entry", first)
		} else {
			seen[key{t.Target, t.Adapter}] = tp
		}
		if t.Adapter != "" {
			es.Append(yamlconf.CheckID(tp+".adapter", t.Adapter))
		}
		nodes := make(map[string]bool, len(t.Nodes))
		for j, n := range t.Nodes {
			np := fmt.Sprintf("%s.nodes[%d]", tp, j)
			if err := yamlconf.CheckID(np, n); err != nil {
				es.Append(err)
			} else if nodes[n] {
				es.Add(np, "duplicate node %q", n)
			}
			nodes[n] = true
		}
	}
	return es
}

// checkModelName checks a model or target name: 1 to MaxModelName bytes of UTF-8 with no spaces
// or control characters. Providers spell names their own way ("llama3.2:latest",
// "meta-llama/Llama-3.1-8B-Instruct"), so nothing stricter is asked.
func checkModelName(path, s string) *yamlconf.Error {
	switch {
	case s == "":
		return yamlconf.Errorf(path, "required")
	case len(s) > MaxModelName:
		return yamlconf.Errorf(path, "must be at most %d bytes, got %d", MaxModelName, len(s))
	case !utf8.ValidString(s):
		return yamlconf.Errorf(path, "must be valid UTF-8")
	case strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return yamlconf.Errorf(path, "must not contain spaces or control characters, got %q", s)
	}
	return nil
}
