package adminapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// The credential endpoints (SPEC R11, S4):
//
//	GET  /admin/v1/credentials                   every credential (name, kind, source,
//	                                             revision, revoked, disabled, profiles)
//	                                             and every profile (name, credential,
//	                                             disabled); never a value
//	POST /admin/v1/credentials/{name}/{action}   revoke, reload, disable or enable a
//	                                             credential; 200 with its new view
//	POST /admin/v1/profiles/{name}/{action}      disable or enable a profile's leases;
//	                                             200 with its new view
//
// A POST needs the API key of a principal with admin: true: 401 without a
// valid key, 403 for any other principal, anonymous included. Then 400 for
// an unknown action, 404 for an unknown name, 409 for disabling a profile
// that uses no credential, and 500 when a reload cannot read the source (the
// message names the source, never a value). Every change is logged at Warn
// with the principal, the action, the name and the credential's revision.
// Without a credential store every credential endpoint answers 404.

// Actions on a credential and on a profile.
var (
	credentialActions = []string{"revoke", "reload", "disable", "enable"}
	profileActions    = []string{"disable", "enable"}
)

func (h *handler) credentialRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /admin/v1/credentials", h.read(h.listCredentials))
	mux.HandleFunc("POST /admin/v1/credentials/{name}/{action}", h.changeCredential)
	mux.HandleFunc("POST /admin/v1/profiles/{name}/{action}", h.changeProfile)
}

type errorBody struct {
	Error string `json:"error"`
}

// noStore answers 404 when the Edge has no credential store, and reports whether it did.
func (h *handler) noStore(w http.ResponseWriter) bool {
	if h.creds != nil {
		return false
	}
	writeJSON(w, http.StatusNotFound, errorBody{"this Edge has no credential store: credentials are not enabled"})
	return true
}

func (h *handler) listCredentials(w http.ResponseWriter, r *http.Request) {
	if h.noStore(w) {
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Credentials []credentials.View        `json:"credentials"`
		Profiles    []credentials.ProfileView `json:"profiles"`
	}{h.creds.Views(), h.creds.ProfileViews()})
}

// admin returns the principal of r when it is an admin; otherwise it answers 401 or 403 and
// returns false.
func (h *handler) admin(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	const howTo = "send the API key of a principal that has admin: true (principals[].admin in the Edge config) as \"Authorization: Bearer KEY\"; reads are open to all only with api.admin_reads: open"
	if h.authn == nil {
		writeJSON(w, http.StatusForbidden, errorBody{"admin is required, and this Edge has no authenticator for the admin endpoints: nobody may change state"})
		return auth.Principal{}, false
	}
	p, err := h.authn.Authenticate(r)
	switch {
	case err != nil:
		w.Header().Set("WWW-Authenticate", `Bearer realm="iop-admin"`)
		writeJSON(w, http.StatusUnauthorized, errorBody{fmt.Sprintf("%v; admin endpoints that change state need an admin: %s", err, howTo)})
		return auth.Principal{}, false
	case p.Name == edgeconfig.AnonymousPrincipal:
		h.log.Info("admin request refused", "principal", p.Name, "method", r.Method, "path", r.URL.Path)
		writeJSON(w, http.StatusForbidden, errorBody{fmt.Sprintf("admin is required, and a request without a key acts as %q, which never is: %s", p.Name, howTo)})
		return auth.Principal{}, false
	case !p.Admin:
		h.log.Info("admin request refused", "principal", p.Name, "method", r.Method, "path", r.URL.Path)
		writeJSON(w, http.StatusForbidden, errorBody{fmt.Sprintf("admin is required, and principal %q is not one: %s", p.Name, howTo)})
		return auth.Principal{}, false
	}
	return p, true
}

func (h *handler) changeCredential(w http.ResponseWriter, r *http.Request) {
	if h.noStore(w) {
		return
	}
	p, ok := h.admin(w, r)
	if !ok {
		return
	}
	name, action := r.PathValue("name"), r.PathValue("action")
	var err error
	switch action {
	case "revoke":
		_, err = h.creds.Revoke(name)
	case "reload":
		_, err = h.creds.Reload(name)
	case "disable":
		err = h.creds.DisableCredential(name)
	case "enable":
		err = h.creds.EnableCredential(name)
	default:
		badAction(w, "credential", action, credentialActions)
		return
	}
	if err != nil {
		h.fail(w, p, "credential", name, action, err)
		return
	}
	v, err := h.creds.View(name)
	if err != nil {
		h.fail(w, p, "credential", name, action, err)
		return
	}
	h.log.Warn("admin: credential changed", "principal", p.Name, "action", action, "credential", name,
		"revision", v.Revision, "revoked", v.Revoked, "disabled", v.Disabled)
	writeJSON(w, http.StatusOK, v)
}

func (h *handler) changeProfile(w http.ResponseWriter, r *http.Request) {
	if h.noStore(w) {
		return
	}
	p, ok := h.admin(w, r)
	if !ok {
		return
	}
	name, action := r.PathValue("name"), r.PathValue("action")
	var err error
	switch action {
	case "disable":
		err = h.creds.DisableProfile(name)
	case "enable":
		err = h.creds.EnableProfile(name)
	default:
		badAction(w, "profile", action, profileActions)
		return
	}
	if err != nil {
		h.fail(w, p, "profile", name, action, err)
		return
	}
	v, err := h.creds.ProfileView(name)
	if err != nil {
		h.fail(w, p, "profile", name, action, err)
		return
	}
	attrs := []any{"principal", p.Name, "action", action, "profile", name, "disabled", v.Disabled}
	if v.Credential != "" {
		if cv, err := h.creds.View(v.Credential); err == nil {
			attrs = append(attrs, "credential", cv.Name, "revision", cv.Revision)
		}
	}
	h.log.Warn("admin: profile changed", attrs...)
	writeJSON(w, http.StatusOK, v)
}

func badAction(w http.ResponseWriter, subject, action string, valid []string) {
	writeJSON(w, http.StatusBadRequest, errorBody{fmt.Sprintf("unknown %s action %q; one of %q", subject, action, valid)})
}

// fail answers a refused or failed change. Store errors name credentials, profiles and
// sources, never values, so their messages are safe to return and log.
func (h *handler) fail(w http.ResponseWriter, p auth.Principal, subject, name, action string, err error) {
	code := http.StatusInternalServerError
	var se *credentials.SourceError
	switch {
	case errors.Is(err, credentials.ErrUnknown):
		code = http.StatusNotFound
	case errors.Is(err, credentials.ErrNoCredential):
		code = http.StatusConflict
	case errors.As(err, &se):
		h.log.Warn("admin: "+subject+" "+action+" failed", "principal", p.Name, "action", action, subject, name, "err", err)
	default:
		h.log.Error("admin: "+subject+" "+action+" failed", "principal", p.Name, "action", action, subject, name, "err", err)
	}
	writeJSON(w, code, errorBody{err.Error()})
}
