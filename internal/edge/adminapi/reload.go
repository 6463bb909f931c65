package adminapi

import (
	"errors"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/reload"
)

// The reload endpoint (SPEC P5):
//
//	POST /admin/v1/reload   read the configuration file again and apply what may change
//	                        without a restart (see package reload)
//
// It needs the API key of a principal with admin: true, whatever api.admin_reads says: 401
// without a valid key, 403 for anyone else. Then 200 with a reload.Result when the reload was
// applied (its restart_required lists what the file changes that only a restart applies, not
// applied); 422 with the Result and its error when the file, or a credential it names, was
// refused, and the running configuration stays (this includes a file that would leave no admin
// key, edgeconfig.ErrLastAdminKey: the caller would lock itself out); 409 when the Edge has no
// file to read. Without Options.Reloader it answers 404.

func (h *handler) reloadRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /admin/v1/reload", h.reload)
}

func (h *handler) reload(w http.ResponseWriter, r *http.Request) {
	if h.reloader == nil {
		writeJSON(w, http.StatusNotFound, errorBody{"this Edge cannot reload its configuration"})
		return
	}
	p, ok := h.admin(w, r)
	if !ok {
		return
	}
	res, err := h.reloader.Reload("admin principal " + p.Name)
	switch {
	case errors.Is(err, reload.ErrNoFile):
		writeJSON(w, http.StatusConflict, res)
	case err != nil:
		writeJSON(w, http.StatusUnprocessableEntity, res)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}
