package yamlconf

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Log is the `log` section, the same in both daemons.
type Log struct {
	Level  string `yaml:"level"`  // debug, info (default), warn or error
	Format string `yaml:"format"` // text (default) or json
}

// SetDefaults fills an unset level with "info" and an unset format with "text".
func (l *Log) SetDefaults() {
	if l.Level == "" {
		l.Level = "info"
	}
	if l.Format == "" {
		l.Format = "text"
	}
}

// Validate reports an unknown level or format, naming fields under path.
func (l Log) Validate(path string) []*Error {
	var es Errors
	if !contains([]string{"debug", "info", "warn", "error"}, l.Level) {
		es.Add(keyPath(path, "level"), "must be one of debug, info, warn, error; got %q", l.Level)
	}
	if !contains([]string{"text", "json"}, l.Format) {
		es.Add(keyPath(path, "format"), "must be text or json, got %q", l.Format)
	}
	return es
}

// SlogLevel returns the level for log/slog; an invalid level (which Validate refuses) is Info.
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Identity modes.
const (
	// ModeMTLS is managed mode: Edge and Node prove their workload identity with certificates
	// issued by the CA in ca_file before anything is registered or dispatched (SPEC S3).
	ModeMTLS = "mtls"
	// ModeLoopback is the development mode: no certificates and no authentication, so both
	// daemons are kept on loopback addresses.
	ModeLoopback = "loopback"
	// DefaultTrustDomain is the trust domain used when the file names none.
	DefaultTrustDomain = "iop.local"
)

// Identity is the `identity` section: how a daemon proves who it is and checks its peer.
//
// The three files may be named by relative paths: a daemon's Load resolves them against the
// directory of the configuration file (see ResolvePaths), so `ca_file: iop-ca.pem` means the
// iop-ca.pem next to edge.yaml whatever the working directory.
type Identity struct {
	Mode        string `yaml:"mode"`         // ModeMTLS (default) or ModeLoopback
	TrustDomain string `yaml:"trust_domain"` // the domain workload identities belong to; default DefaultTrustDomain
	CAFile      string `yaml:"ca_file"`      // PEM CA bundle that issues peer certificates; mtls only; relative to the config file
	CertFile    string `yaml:"cert_file"`    // PEM certificate of this daemon; mtls only; relative to the config file
	KeyFile     string `yaml:"key_file"`     // PEM private key of cert_file; mtls only; relative to the config file
}

// ResolvePaths makes the relative CAFile, CertFile and KeyFile relative to dir instead (see
// ResolvePath). A daemon's Load calls it with the configuration file's directory.
func (id *Identity) ResolvePaths(dir string) {
	for _, p := range []*string{&id.CAFile, &id.CertFile, &id.KeyFile} {
		*p = ResolvePath(dir, *p)
	}
}

// ResolvePath returns the file path p, written in a configuration file in directory dir, as a
// path that names the same file from anywhere: p itself when it is absolute or empty (a field
// left unset), otherwise p joined to dir, made absolute when the working directory is known so
// that it stays right if the process changes directory later.
func ResolvePath(dir, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return filepath.Join(dir, p)
}

// SetDefaults fills an unset mode with mtls and an unset trust domain with DefaultTrustDomain.
func (id *Identity) SetDefaults() {
	if id.Mode == "" {
		id.Mode = ModeMTLS
	}
	if id.TrustDomain == "" {
		id.TrustDomain = DefaultTrustDomain
	}
}

var trustDomain = regexp.MustCompile(`^[a-z0-9.-]{1,255}$`)

// Validate checks the mode, the trust domain and that the certificate files are named exactly
// when mtls needs them, naming fields under path. It does not open the files.
func (id Identity) Validate(path string) []*Error {
	var es Errors
	if !trustDomain.MatchString(id.TrustDomain) {
		es.Add(keyPath(path, "trust_domain"), "must be 1 to 255 characters of lowercase letters, digits, '.' or '-'; got %q", id.TrustDomain)
	}
	files := []struct{ key, value string }{{"ca_file", id.CAFile}, {"cert_file", id.CertFile}, {"key_file", id.KeyFile}}
	switch id.Mode {
	case ModeMTLS:
		for _, f := range files {
			if f.value == "" {
				es.Add(keyPath(path, f.key), "required in mtls mode")
			}
		}
	case ModeLoopback:
		for _, f := range files {
			if f.value != "" {
				es.Add(keyPath(path, f.key), "not used in loopback mode; remove it or set mode: mtls")
			}
		}
	default:
		es.Add(keyPath(path, "mode"), "must be %q or %q, got %q", ModeMTLS, ModeLoopback, id.Mode)
	}
	return es
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// CheckID checks an identifier (an Edge or Node id, a provider name): 1 to 128 letters, digits,
// '.', '_' or '-'. It returns nil when s is valid.
func CheckID(path, s string) *Error {
	if s == "" {
		return Errorf(path, "required")
	}
	if !idPattern.MatchString(s) {
		return Errorf(path, "must be 1 to 128 characters of letters, digits, '.', '_' or '-'; got %q", s)
	}
	return nil
}

// CheckHostPort checks that addr is host:port with a numeric port from 0 to 65535 (the host may
// be empty, meaning every interface), and returns the host.
func CheckHostPort(path, addr string) (host string, port int, err *Error) {
	if addr == "" {
		return "", 0, Errorf(path, "required, as host:port")
	}
	host, p, splitErr := net.SplitHostPort(addr)
	if splitErr != nil {
		var ae *net.AddrError
		reason := splitErr.Error()
		if errors.As(splitErr, &ae) {
			reason = ae.Err
		}
		return "", 0, Errorf(path, "must be host:port, got %q (%s)", addr, reason)
	}
	port, convErr := strconv.Atoi(p)
	if convErr != nil || port < 0 || port > 65535 || strings.TrimLeft(p, "0123456789") != "" {
		return "", 0, Errorf(path, "port must be a number from 0 to 65535, got %q", p)
	}
	return host, port, nil
}

// IsLoopbackHost reports whether host is "localhost" or a loopback IP literal (127.0.0.0/8, ::1).
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// NewLogger returns the structured logger the section describes, writing
// to w.
func (l Log) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.SlogLevel()}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
