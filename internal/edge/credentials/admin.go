package credentials

// The operations an operator drives through the admin API. Each is serialised with the others
// (and with Apply) by Store.admin, and closes Changed when it changed something. Holding admin,
// they may read the layout without mu: only Apply replaces it, and Apply holds admin too.

// Revoke raises the revision of the credential called name by one and marks it revoked: no
// lease of it is issued until Reload, and Nodes, once they have the Notice, refuse every lease
// below the new revision. Its value is wiped. Revoking a revoked credential raises the revision
// again. It returns the new revision; an unknown name is an *Error matching ErrUnknown.
func (s *Store) Revoke(name string) (revision uint64, err error) {
	s.admin.Lock()
	defer s.admin.Unlock()
	c, ok := s.creds[name]
	if !ok {
		return 0, s.unknown("credential", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c.revision++
	c.revoked = true
	clear(c.secret)
	c.secret = nil
	s.notifyLocked()
	return c.revision, nil
}

// Reload reads the value of the credential called name from its source again, and returns its
// revision. After a Revoke it keeps the revision Revoke raised and ends the revocation; without
// one it raises the revision by one, since the value may have changed and leases of the old one
// must die. When the source cannot be read (a *SourceError, naming the source and never the
// value) nothing changes: a revoked credential stays revoked, and one in use keeps its value.
//
// Reload does not hold the lock Grant needs while it reads, so a slow file does not hold up
// dispatch.
func (s *Store) Reload(name string) (revision uint64, err error) {
	s.admin.Lock()
	defer s.admin.Unlock()
	c, ok := s.creds[name]
	if !ok {
		return 0, s.unknown("credential", name)
	}
	secret, err := s.read(c.cfg)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.revoked {
		c.revoked = false
	} else {
		c.revision++
	}
	clear(c.secret)
	c.secret = secret
	s.notifyLocked()
	return c.revision, nil
}

// DisableCredential stops every lease of the credential called name, whichever profile asks,
// until EnableCredential; Nodes refuse its leases once they have the Notice. Its revision and
// value are kept. Disabling a disabled credential changes nothing.
func (s *Store) DisableCredential(name string) error { return s.setCredential(name, true) }

// EnableCredential undoes DisableCredential. Enabling an enabled credential changes nothing.
func (s *Store) EnableCredential(name string) error { return s.setCredential(name, false) }

func (s *Store) setCredential(name string, disabled bool) error {
	s.admin.Lock()
	defer s.admin.Unlock()
	c, ok := s.creds[name]
	if !ok {
		return s.unknown("credential", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.disabled != disabled {
		c.disabled = disabled
		s.notifyLocked()
	}
	return nil
}

// DisableProfile stops the leases of the profile called name, and so every request of that
// profile, until EnableProfile; Nodes refuse its leases once they have the Notice. A profile
// that uses no credential has no lease to stop: disabling it is an *Error matching
// ErrNoCredential. Disabling a disabled profile changes nothing.
func (s *Store) DisableProfile(name string) error { return s.setProfile(name, true) }

// EnableProfile undoes DisableProfile. Enabling an enabled profile, or one that uses no
// credential, changes nothing.
func (s *Store) EnableProfile(name string) error { return s.setProfile(name, false) }

func (s *Store) setProfile(name string, disabled bool) error {
	s.admin.Lock()
	defer s.admin.Unlock()
	p, ok := s.profiles[name]
	switch {
	case !ok:
		return s.unknown("profile", name)
	case p.credential == "" && disabled:
		return &Error{Reason: ReasonNoCredential, Subject: "profile", Name: name}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.disabled != disabled {
		p.disabled = disabled
		s.notifyLocked()
	}
	return nil
}

// View is what the admin API shows of a credential: never its value.
type View struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Source   string `json:"source"` // "env:NAME" or "file:PATH"
	Revision uint64 `json:"revision"`
	Revoked  bool   `json:"revoked"`  // no lease until reloaded
	Disabled bool   `json:"disabled"` // no lease until enabled
	// Profiles are the names of the profiles that use the credential, sorted.
	Profiles []string `json:"profiles"`
}

// ProfileView is what the admin API shows of a profile's credential state.
type ProfileView struct {
	Name       string `json:"name"`
	Credential string `json:"credential,omitempty"` // "" when the profile uses none
	Disabled   bool   `json:"disabled"`
}

// Views returns every credential, sorted by name.
func (s *Store) Views() []View {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]View, 0, len(s.credNames))
	for _, name := range s.credNames {
		out = append(out, s.viewLocked(s.creds[name]))
	}
	return out
}

// View returns the credential called name; an unknown name is an *Error matching ErrUnknown.
func (s *Store) View(name string) (View, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, ok := s.creds[name]
	if !ok {
		return View{}, s.unknown("credential", name)
	}
	return s.viewLocked(c), nil
}

func (s *Store) viewLocked(c *credential) View {
	return View{Name: c.cfg.Name, Kind: c.cfg.Kind, Source: c.cfg.Source(), Revision: c.revision,
		Revoked: c.revoked, Disabled: c.disabled, Profiles: append([]string{}, c.profiles...)}
}

// ProfileViews returns every profile, sorted by name, with the default profile among them.
func (s *Store) ProfileViews() []ProfileView {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]ProfileView, 0, len(s.profNames))
	for _, name := range s.profNames {
		p := s.profiles[name]
		out = append(out, ProfileView{Name: name, Credential: p.credential, Disabled: p.disabled})
	}
	return out
}

// ProfileView returns the profile called name; an unknown name is an *Error matching
// ErrUnknown.
func (s *Store) ProfileView(name string) (ProfileView, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.profiles[name]
	if !ok {
		return ProfileView{}, s.unknown("profile", name)
	}
	return ProfileView{Name: name, Credential: p.credential, Disabled: p.disabled}, nil
}
