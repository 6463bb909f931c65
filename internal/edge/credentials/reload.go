package credentials

import (
	"errors"
	"slices"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// Apply makes the credentials and profiles of cfg the store's, for a configuration reload. It
// is all or nothing: it reads the value of every credential that is new or whose source or
// kind changed first, and when any cannot be read, or cfg has a problem New refuses, it returns
// the error and changes nothing.
//
// What carries over, by name: a credential whose source and kind are unchanged keeps its value,
// revision and revoked and disabled state (a reload of the file is not a reload of the value:
// that is Reload's). A credential whose source or kind changed gets the value read now and its
// revision raised by one, so that Nodes refuse leases of the old value, and is no longer
// revoked; it stays disabled if it was. A new credential starts at revision 1, or above the
// last revision of a credential of that name that an earlier reload removed. A profile keeps
// its disabled state while it still uses a credential. Changed fires when anything changed.
//
// Work already dispatched keeps the lease it carries; a new dispatch of a profile the reload
// removed is refused as an unknown profile.
func (s *Store) Apply(cfg *edgeconfig.Config) error {
	if cfg == nil {
		return errors.New("credentials: nil config")
	}
	l, err := newLayout(cfg)
	if err != nil {
		return err
	}
	s.admin.Lock()
	defer s.admin.Unlock()

	// Read what must be read before taking mu, so a slow file does not hold up dispatch.
	fresh := map[string][]byte{}
	var errs []error
	for _, name := range l.credsInFile {
		c := l.creds[name]
		if old, ok := s.creds[name]; ok && old.cfg == c.cfg {
			continue
		}
		secret, err := s.read(c.cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fresh[name] = secret
	}
	if len(errs) > 0 {
		for _, v := range fresh {
			clear(v)
		}
		return errors.Join(errs...)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	changed := !slices.Equal(s.credNames, l.credNames) || !slices.Equal(s.profNames, l.profNames)
	for name, c := range l.creds {
		old, had := s.creds[name]
		switch secret, read := fresh[name]; {
		case !read: // unchanged: carry everything over; the old layout gives up its value
			c.secret, c.revision, c.revoked, c.disabled = old.secret, old.revision, old.revoked, old.disabled
			old.secret = nil
		case had:
			c.secret, c.revision, c.disabled = secret, old.revision+1, old.disabled
			changed = true
		default:
			c.secret, c.revision = secret, s.retired[name]+1
			changed = true
		}
		delete(s.retired, name)
	}
	for name, old := range s.creds {
		if _, kept := l.creds[name]; !kept {
			s.retired[name] = old.revision
			clear(old.secret)
			old.secret = nil
		} else {
			clear(old.secret) // a value replaced by a fresh read; nil when carried over
		}
	}
	for name, p := range l.profiles {
		if old, ok := s.profiles[name]; ok {
			p.disabled = old.disabled && p.credential != ""
			changed = changed || old.credential != p.credential || old.disabled != p.disabled
		}
	}
	s.layout = *l
	if changed {
		s.notifyLocked()
	}
	return nil
}
