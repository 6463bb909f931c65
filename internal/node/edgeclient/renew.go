package edgeclient

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Certificates is the Node's certificate as the transport renews it
// (*nodecert.Holder implements it).
type Certificates interface {
	// Validity is the current certificate's validity window.
	Validity() (notBefore, notAfter time.Time)
	// Request makes a certificate request for the Node's key.
	Request() ([]byte, error)
	// Install checks a renewed chain and makes it the certificate the
	// next connections present.
	Install(chain [][]byte) error
}

// Renewal timing: a certificate is renewed at two thirds of its lifetime; a
// failed attempt is retried after a tenth of what is left, within bounds.
const (
	renewAnswerWait = 30 * time.Second
	minRenewRetry   = time.Second
	maxRenewRetry   = 5 * time.Minute
	// maxRenewWait bounds the wait an Edge may ask for.
	maxRenewWait = 24 * time.Hour
)

// renewAt is when a certificate valid from nb to na is renewed.
func renewAt(nb, na time.Time) time.Time { return nb.Add(na.Sub(nb) * 2 / 3) }

// renewRetry is how long to wait after a failed renewal.
func renewRetry(na, now time.Time) time.Duration {
	return min(max(na.Sub(now)/10, minRenewRetry), maxRenewRetry)
}

// retryWait is how long to wait after a failed renewal of a certificate
// that expires at na: the wait the Edge asked for when it deferred the
// renewal (it rate-limits renewals per Node, and asking before then is
// refused again), never past the expiry; the Node's own rule otherwise.
func retryWait(err error, na, now time.Time) (wait time.Duration, deferred bool) {
	var refused renewErr
	if errors.As(err, &refused) && refused.retryAfter > 0 {
		return min(refused.retryAfter, max(na.Sub(now), minRenewRetry)), true
	}
	return renewRetry(na, now), false
}

// renew renews the Node's certificate on conn's control stream whenever it
// is due, for as long as the connection lives. The connection itself is
// never touched: runs in flight go on, and the next connection presents
// the new certificate. Answers arrive from the control loop on
// conn.certAnswers.
func (c *Client) renew(ctx context.Context, conn *connection, log *slog.Logger) {
	certs := c.opts.Certificates
	var wait time.Duration
	for {
		nb, na := certs.Validity()
		if wait == 0 {
			wait = time.Until(renewAt(nb, na))
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		wait = 0
		if nb2, na2 := certs.Validity(); !nb2.Equal(nb) || !na2.Equal(na) {
			// Renewed meanwhile, on another Edge's connection
			// (cluster.go): due again only at the new one's time.
			continue
		}
		if err := c.renewOnce(ctx, conn); err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errRenewElsewhere) {
				wait = minRenewRetry
				continue
			}
			var deferred bool
			wait, deferred = retryWait(err, na, time.Now())
			if deferred {
				log.Info("certificate renewal deferred by the Edge", "err", err, "retry_in", wait, "expires", na.UTC().Format(time.RFC3339))
				continue
			}
			log.Warn("certificate renewal failed; retrying", "err", err, "retry_in", wait, "expires", na.UTC().Format(time.RFC3339))
			continue
		}
		nb2, na2 := certs.Validity()
		log.Info("certificate renewed", "not_before", nb2.UTC().Format(time.RFC3339), "not_after", na2.UTC().Format(time.RFC3339))
	}
}

// errRenewElsewhere: another connection of this Node is renewing its
// certificate now; this one looks again after its retry wait, and finds
// the certificate renewed.
var errRenewElsewhere = errors.New("the certificate is being renewed on another edge connection")

// errNoRenewAnswer: the Edge did not answer a certificate request.
var errNoRenewAnswer = errors.New("no answer to the certificate request")

// renewErr is the Edge's refusal of a renewal, with how long it asks the
// Node to wait before the next request (0: the Node's own rule).
type renewErr struct {
	reason     string
	retryAfter time.Duration
}

func (e renewErr) Error() string { return "edge refused: " + e.reason }

func (c *Client) renewOnce(ctx context.Context, conn *connection) error {
	if g := c.opts.RenewGate; g != nil {
		// One renewal at a time over all the Node's connections.
		if !g.TryLock() {
			return errRenewElsewhere
		}
		defer g.Unlock()
	}
	csr, err := c.opts.Certificates.Request()
	if err != nil {
		return err
	}
	if err := conn.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_CertificateRequest{
		CertificateRequest: &wirepb.CertificateRequest{Csr: csr},
	}}); err != nil {
		return err
	}
	t := time.NewTimer(renewAnswerWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return &transport.ProtocolError{Stream: "control", Err: errNoRenewAnswer}
	case resp := <-conn.certAnswers:
		if r := resp.GetRefusal(); r != "" {
			return renewErr{reason: r, retryAfter: time.Duration(min(resp.GetRetryAfterMs(), uint64(maxRenewWait/time.Millisecond))) * time.Millisecond}
		}
		return c.opts.Certificates.Install(resp.GetChain())
	}
}
