package frontdoor

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusals counts what the Edge turns away at its doors (connections over
// the cap, bodies over the memory budget, TLS handshakes and registrations
// refused), by kind, and logs it without letting a flood flood the log:
// the first refusal of a kind is logged at once, the rest at most once per
// interval as one line that says how many were not logged. The counter is
// exact whatever the log shows. A nil *Refusals ignores everything.
type Refusals struct {
	log      *slog.Logger
	counter  *prometheus.CounterVec
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	kinds map[string]*refusalKind
}

type refusalKind struct {
	lastLog    time.Time
	suppressed int
}

// RefusalLogInterval is how often a kind of refusal may be logged.
const RefusalLogInterval = 10 * time.Second

// NewRefusals logs to log and counts into counter (labelled by "kind"),
// which may be nil.
func NewRefusals(log *slog.Logger, counter *prometheus.CounterVec) *Refusals {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Refusals{log: log, counter: counter, interval: RefusalLogInterval, now: time.Now, kinds: map[string]*refusalKind{}}
}

// Refuse records one refusal of kind; msg and args describe this one, and
// are logged at Warn when the interval allows.
func (r *Refusals) Refuse(kind, msg string, args ...any) {
	if r == nil {
		return
	}
	if r.counter != nil {
		r.counter.WithLabelValues(kind).Inc()
	}
	r.mu.Lock()
	k := r.kinds[kind]
	if k == nil {
		k = &refusalKind{}
		r.kinds[kind] = k
	}
	now := r.now()
	if !k.lastLog.IsZero() && now.Sub(k.lastLog) < r.interval {
		k.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := k.suppressed
	k.lastLog, k.suppressed = now, 0
	r.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "not_logged_since_last", suppressed)
	}
	r.log.Warn(msg, append(args, "refusal", kind)...)
}
